"""verl's V1 TaskRunner (a Ray actor) building the workbench trainer instead of verl's plain one.

It lives in its own module so Ray pickles it by reference: `launch` runs as `__main__`.
"""

from __future__ import annotations

import ray
from omegaconf import DictConfig

from verl.trainer.main_ppo import TaskRunnerV1

from .runtime import milestone
from .trainer import workbench_trainer


class _WorkbenchTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config: DictConfig):
        import transfer_queue
        import verl.trainer.ppo.v1 as v1

        milestone("TaskRunner up")
        pick, init_transfer_queue = v1.get_trainer_cls, transfer_queue.init
        v1.get_trainer_cls = lambda mode: workbench_trainer(pick(mode))

        def init_and_say(*args, **kwargs):
            result = init_transfer_queue(*args, **kwargs)
            milestone("TransferQueue ready")
            return result

        transfer_queue.init = init_and_say  # verl's run() calls tq.init through the module
        try:
            return super().run(config)
        finally:
            v1.get_trainer_cls, transfer_queue.init = pick, init_transfer_queue


WorkbenchTaskRunner = ray.remote(_WorkbenchTaskRunner)
