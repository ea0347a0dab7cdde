"""verl's V1 TaskRunner (a Ray actor) building the workbench trainer instead of verl's plain one.

It lives in its own module so Ray pickles it by reference: `launch` runs as `__main__`.
"""

from __future__ import annotations

import ray
from omegaconf import DictConfig

from verl.trainer.main_ppo import TaskRunnerV1

from .trainer import workbench_trainer


class _WorkbenchTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config: DictConfig):
        import verl.trainer.ppo.v1 as v1

        pick = v1.get_trainer_cls
        v1.get_trainer_cls = lambda mode: workbench_trainer(pick(mode))
        try:
            return super().run(config)
        finally:
            v1.get_trainer_cls = pick


WorkbenchTaskRunner = ray.remote(_WorkbenchTaskRunner)
