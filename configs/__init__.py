"""The default configs (YAML), shipped inside the package as ``demoscale.configs``.

``demoscale demo`` and the Lightning CLI configs it names are read from here, so a non-editable
install finds them from any directory; in the repository they are the files of ``configs/``.
"""
