"""One checkpoint, rolled out with different execution settings: how many actions of each predicted
chunk are executed before the policy is asked again (``n_action_steps``) and how many denoising
steps it takes, on one or more sets of initial states (evaluation seeds).

    python benchmarks/execution_horizon.py CHECKPOINT --task pusht --n-action-steps 8 4 2 --seeds 0 1

Training is untouched: these are inference settings of the saved policy (``load_policy``'s
``num_inference_steps``, ``Policy.n_action_steps``). A table on screen, JSON to
``benchmarks/results/execution_horizon.json`` (``--json PATH`` to choose).
"""

from __future__ import annotations

import argparse

from report import add_json_option, emit_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--task", default=None, help="default: the task the checkpoint's data recorded")
    parser.add_argument("--n-action-steps", type=int, nargs="+", default=[8, 4])
    parser.add_argument("--inference-steps", type=int, nargs="+", default=[None])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="evaluation seeds")
    parser.add_argument("--envs", type=int, default=None, help="initial states (default: the task's)")
    parser.add_argument("--threads", type=int, default=2)
    add_json_option(parser)
    args = parser.parse_args(argv)

    import torch
    from demoscale.eval import evaluate
    from demoscale.policies import load_policy

    torch.set_num_threads(args.threads)
    rows = []
    for inference_steps in args.inference_steps:
        for n_action_steps in args.n_action_steps:
            for seed in args.seeds:
                policy = load_policy(args.checkpoint, num_inference_steps=inference_steps)
                if not 1 <= n_action_steps <= policy.horizon:
                    raise SystemExit(f"--n-action-steps {n_action_steps}: the chunk has {policy.horizon}")
                policy.n_action_steps = n_action_steps
                result = evaluate(
                    policy,
                    task=args.task,
                    n_envs=args.envs,
                    seed=seed,
                    batch_size=50,
                    video_episodes=0,
                    progress=False,
                )
                summary = result.summary
                row = {
                    "n_action_steps": n_action_steps,
                    "inference_steps": policy.num_inference_steps,
                    "seed": seed,
                    "rollouts": summary["episodes"],
                    "success": round(summary["success_rate"], 3),
                    "success_ci": f"[{summary['success_ci_low']:.2f}, {summary['success_ci_high']:.2f}]",
                    "score": round(summary["score"], 3),
                }
                if "mean_max_coverage" in summary:
                    row["mean_max_coverage"] = round(summary["mean_max_coverage"], 3)
                rows.append(row)
                print("  ".join(f"{key} {value}" for key, value in row.items()), flush=True)
    columns = list(rows[0])
    print("\n| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(column, "")) for column in columns) + " |")
    emit_json("execution_horizon", {"checkpoint": args.checkpoint, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
