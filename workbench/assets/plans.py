"""The plan for the offline assets: verl PPO (GAE, with a critic) on the generated model and data, one GPU.

The settings that ran on the H200 (bench/results/h200_2026-11-30): verl's defaults that fail on one GPU (rollout TP 2,
unset micro batches) are set, and the small-run worker counts keep start-up short.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def offline_overrides(assets_dir: str | Path) -> list[str]:
    assets = Path(assets_dir)
    return [
        "algorithm.adv_estimator=gae",
        f"data.train_files={assets}/data/train.parquet",
        f"data.val_files={assets}/data/test.parquet",
        "data.dataloader_num_workers=2",
        f"actor_rollout_ref.model.path={assets}/model",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "critic.optim.lr=1e-5",
        f"critic.model.path={assets}/model",
        "reward.num_workers=2",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",
        "trainer.logger=[console]",
        "trainer.project_name=workbench",
        "trainer.experiment_name=offline",
        "trainer.val_before_train=False",
        "trainer.nnodes=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.total_epochs=4",
        "trainer.total_training_steps=60",
    ]


OFFLINE_KNOBS: dict[str, Any] = dict(
    gpus=[0], train_batch_size=64, ppo_mini_batch_size=32, max_prompt_length=256, max_response_length=256,
    actor_micro_batch=16, logprob_micro_batch=16, ref_micro_batch=16, critic_micro_batch=16,
    use_dynamic_bsz=True, actor_token_budget=4096, logprob_token_budget=4096, ref_token_budget=4096,
    critic_token_budget=4096, rollout_gpu_memory=0.5, rollout_tp=1,
)


def offline_plan(assets_dir: str | Path, **changes: Any):
    from ..plan import Plan

    return Plan.from_verl(overrides=offline_overrides(assets_dir)).with_changes({**OFFLINE_KNOBS, **changes})
