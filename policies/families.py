"""The registry of policy families: name -> config class, network, LightningModule.

Adding a family to the project is one entry in :data:`FAMILIES` (``"module.path:attribute"`` strings,
imported only when that family is used); code outside the project calls :func:`register_family` with
the objects themselves. Everything that handles families by name looks them up here: ``load_policy``
(the checkpoint's ``family``), the LightningModule base (building the network), the training CLI
(which lists every registered LightningModule), and so the executor and the rollouts, which act
through ``load_policy``'s :class:`~demoscale.policies.inference.Policy`. The contract a family
implements is in :mod:`demoscale.policies.base`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from demoscale.policies.base import check_network


@dataclass(frozen=True)
class PolicyFamily:
    """One policy family.

    Attributes:
        name: the checkpoint's ``family`` and the LightningModule's ``family`` attribute.
        config: the config dataclass (:class:`~demoscale.policies.base.PolicyConfig`).
        network: ``(config, features, stats=None) -> network`` (a class or a factory) returning a
            :class:`~demoscale.policies.base.PolicyNetwork`.
        module: the :class:`~demoscale.policies.lightning_module.PolicyModule` subclass that trains it.

    Each of ``config``, ``network`` and ``module`` is the object itself or ``"module.path:attribute"``.
    """

    name: str
    config: type | str
    network: Callable[..., Any] | str
    module: type | str

    def config_class(self) -> type:
        return _resolve(self.config, self.name, "config")

    def module_class(self) -> type:
        return _resolve(self.module, self.name, "module")

    def config_from_dict(self, data: Mapping[str, Any]) -> Any:
        """The config from its plain-dict form (as checkpoints carry it); unknown keys raise."""
        from demoscale.policies.config_utils import from_plain

        return from_plain(self.config_class(), data)

    def build_network(
        self, config: Any, features: Mapping[str, Any], stats: Mapping[str, Any] | None = None
    ) -> Any:
        """The family's network for a config and the store's feature spec, checked against the contract."""
        network = _resolve(self.network, self.name, "network")(config, features, stats)
        check_network(network, self.name)
        return network


# The families of this project. Adding one: its config, network and LightningModule, and a line here.
FAMILIES: dict[str, PolicyFamily] = {
    "diffusion": PolicyFamily(
        name="diffusion",
        config="demoscale.policies.diffusion.config:DiffusionConfig",
        network="demoscale.policies.diffusion.waypoint:make_diffusion_policy",
        module="demoscale.policies.diffusion.lightning:DiffusionPolicyModule",
    ),
    "wbvima": PolicyFamily(
        name="wbvima",
        config="demoscale.policies.wbvima.config:WBVIMAConfig",
        network="demoscale.policies.wbvima.model:WBVIMAPolicy",
        module="demoscale.policies.wbvima.lightning:WBVIMAModule",
    ),
}


class UnknownFamilyError(ValueError):
    """A family name that is not registered."""


def register_family(family: PolicyFamily, replace: bool = False) -> PolicyFamily:
    """Add a family (e.g. from a package of one's own, at import); the name must be new unless ``replace``."""
    if not family.name:
        raise ValueError("a policy family needs a name")
    if family.name in FAMILIES and not replace and FAMILIES[family.name] != family:
        raise ValueError(
            f"policy family {family.name!r} is already registered (pass replace=True to swap it)"
        )
    if isinstance(family.module, type) and getattr(family.module, "family", None) != family.name:
        raise ValueError(
            f"{family.module.__name__}.family is {getattr(family.module, 'family', None)!r}, but the family is "
            f"registered as {family.name!r}: the two must match (checkpoints record the module's)"
        )
    FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove a registered family (a no-op for an unknown name)."""
    FAMILIES.pop(name, None)


def get_family(name: str) -> PolicyFamily:
    """The registered family called ``name``; :class:`UnknownFamilyError` lists the known ones."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise UnknownFamilyError(
            f"unknown policy family {name!r}; registered: {family_names()} (a family of your own is "
            "added with demoscale.policies.register_family)"
        ) from None


def family_names() -> list[str]:
    """The registered family names, sorted."""
    return sorted(FAMILIES)


def _resolve(target: Any, family: str, what: str) -> Any:
    if not isinstance(target, str):
        return target
    module_name, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"policy family {family!r}: cannot import its {what} {target!r}: {error}"
        ) from error
