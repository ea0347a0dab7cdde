"""verl's V1 TaskRunner (a Ray actor) building the workbench trainer instead of verl's plain one, and rebuilding it in
place when a restart-class change allows (rebuild.py).

It lives in its own module so Ray pickles it by reference: `launch` runs as `__main__`.
"""

from __future__ import annotations

import os
from pprint import pprint

import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.main_ppo import TaskRunnerV1
from verl.utils.logging_utils import configure_verl_logging

from .. import control as c
from ..store import Store
from .rebuild import rebuild
from .runtime import milestone
from .trainer import workbench_trainer


def trainer_class(config: DictConfig) -> type:
    from verl.trainer.ppo.v1 import get_trainer_cls

    return workbench_trainer(get_trainer_cls(config.trainer.v1.trainer_mode))


class _WorkbenchTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config: DictConfig):
        """verl 0.9.1's TaskRunnerV1.run, with the workbench's trainer, start-up milestones, and a loop: a fit that
        ended for an in-place rebuild (the trainer's `wb_rebuild_request`) goes on with the rebuilt trainer."""
        import transfer_queue as tq

        milestone("TaskRunner up")
        configure_verl_logging()
        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        self.config = config
        tq.init(config.transfer_queue)
        milestone("TransferQueue ready")
        succeeded = False
        try:
            self.trainer = trainer_class(config)(config=config)
            self.trainer.init()
            self.init_agent_loop_manager()
            rollout_owner = self.trainer
            while True:
                self.trainer.fit(self.agent_loop_manager)
                request = getattr(self.trainer, "wb_rebuild_request", None)
                if request is None:
                    break
                try:
                    rollout_owner = rebuild(self, self.trainer, rollout_owner, request, trainer_class)
                except Exception as error:
                    # Before verl is ready again: the supervisor relaunches from the checkpoint just written.
                    Store(os.environ[c.SESSION_ENV]).add_event(
                        c.EV_REBUILD_FAILED, f"rebuilding verl in place failed ({error!r}): relaunching instead",
                        {"segment": request["segment"]})
                    raise
            succeeded = True
        finally:
            try:
                tracking = getattr(self.trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()


WorkbenchTaskRunner = ray.remote(_WorkbenchTaskRunner)
