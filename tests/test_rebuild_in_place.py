"""Restart-class changes rebuilt in place (issue 17): what each knob's change keeps of the running verl (the knob
table), the supervisor's choice between an in-place rebuild and a relaunch, the step boundary that checkpoints and
opens the rebuilt segment, the trainer's request to its TaskRunner, the environment and config of the rebuild, and
the kept rollout handed to verl's trainer. The rebuild itself (killing FSDP workers, verl's trainer built anew in
the TaskRunner) needs a GPU: bench/gpu/inplace_probe.py proved it on an H200, the campaign measures it through the
Session API."""

from __future__ import annotations

import json
import os
import types

import pytest
from omegaconf import OmegaConf

from tests.plan_fixtures import runnable_plan, tiny_model  # noqa: F401 (fixtures)
from workbench import checkpoints
from workbench import control as c
from workbench.boundary import StepBoundary
from workbench.handles import judge_change
from workbench.knob import (KEEPS_PROCESSES, KEEPS_ROLLOUT, KEEPS_SERVERS, KEEPS_TRAINER, REBUILD_KEEPS, RELAUNCH,
                            RunnerPath, checkpoints_first, least_kept)
from workbench.knobs import KNOBS
from workbench.runs import Run
from workbench.store import Store

TOKEN = "supervisor-token"


# ------------------------------------------------------------------ the knob table
def test_every_restart_knob_says_what_a_rebuild_keeps_and_no_hot_knob_does():
    for name, knob in KNOBS.items():
        if knob.apply == "restart":
            assert knob.runner.keeps in REBUILD_KEEPS, name
        else:
            assert knob.runner.keeps == "", name
    with pytest.raises(ValueError, match="what a restart keeps"):
        RunnerPath("restart")
    with pytest.raises(ValueError, match="what a restart keeps"):
        RunnerPath("worker", method="_wb_x", keeps=KEEPS_ROLLOUT)
    # only new processes take a new environment or other GPUs
    assert {KNOBS[k].runner.keeps for k in ("nccl_env", "gpus", "critic_gpus")} == {RELAUNCH}
    assert least_kept(KEEPS_ROLLOUT, KEEPS_PROCESSES, KEEPS_SERVERS) == KEEPS_PROCESSES
    # the rollout engine's settings keep the trainer's workers; its parallelism shapes those workers' adapters
    assert {KNOBS[k].runner.keeps for k in ("rollout_gpu_memory", "rollout_max_num_seqs", "rollout_max_batched_tokens",
                                            "rollout_enforce_eager")} == {KEEPS_TRAINER}
    assert KNOBS["rollout_tp"].runner.keeps == KEEPS_PROCESSES


def test_what_several_changes_keep_is_what_each_of_them_keeps():
    assert least_kept(KEEPS_TRAINER, KEEPS_TRAINER) == KEEPS_TRAINER
    assert least_kept(KEEPS_ROLLOUT, KEEPS_SERVERS) == KEEPS_SERVERS
    # a rollout setting rebuilds the rollout, a LoRA critic or a trainer mode the trainer: only the processes stay
    assert least_kept(KEEPS_TRAINER, KEEPS_ROLLOUT) == KEEPS_PROCESSES
    assert least_kept(KEEPS_SERVERS, KEEPS_TRAINER) == KEEPS_PROCESSES
    assert least_kept(KEEPS_TRAINER, RELAUNCH) == RELAUNCH
    assert [k for k in REBUILD_KEEPS if not checkpoints_first(k)] == [KEEPS_TRAINER]


@pytest.mark.parametrize("changes, keeps", [
    ({"ppo_mini_batch_size": 2}, KEEPS_ROLLOUT),
    ({"critic_lora_rank": 8}, KEEPS_ROLLOUT),
    ({"trainer_mode": "colocate_async"}, KEEPS_SERVERS),
    ({"ppo_mini_batch_size": 2, "rollout_max_num_seqs": 128}, KEEPS_PROCESSES),
    ({"rollout_max_num_seqs": 128, "rollout_gpu_memory": 0.45}, KEEPS_TRAINER),
    ({"rollout_gpu_memory": 0.45, "max_prompt_length": 77}, KEEPS_PROCESSES),
    ({"rollout_gpu_memory": 0.45, "trainer_mode": "colocate_async"}, KEEPS_PROCESSES),
    ({"ppo_mini_batch_size": 2, "nccl_env": {"NCCL_P2P_DISABLE": "1"}}, RELAUNCH),
])
def test_a_change_keeps_the_least_any_of_its_knobs_keeps(runnable_plan, changes, keeps):
    assert judge_change(runnable_plan, changes, gpu_count=1, with_verl=False).keeps == keeps


def test_the_knob_table_and_a_preview_say_what_a_restart_keeps(tmp_path, runnable_plan, monkeypatch):
    from tests.test_engine_face import make_session_dir
    from workbench.session import Session

    store = make_session_dir(tmp_path / "s", runnable_plan)
    session = Session(tmp_path / "s")
    table = session.knob_table().set_index("name")
    assert table.loc["trainer_mode", "keeps"] == KEEPS_SERVERS and table.loc["actor_token_budget", "keeps"] == ""
    assert session.preview({"ppo_mini_batch_size": 2}).keeps == KEEPS_ROLLOUT
    assert session.preview({"actor_token_budget": 6000}).keeps == ""
    monkeypatch.setenv("WORKBENCH_IN_PLACE", "0")
    assert session.preview({"ppo_mini_batch_size": 2}).keeps == RELAUNCH
    store.close()


def test_a_replays_preview_says_its_restart_is_the_recorded_relaunch(tmp_path, runnable_plan):
    from tests.test_engine_face import make_session_dir
    from workbench.recordings import BUNDLED
    from workbench.session import Session

    store = make_session_dir(tmp_path / "s", runnable_plan)
    store.set_meta(kind="replay", recording=str(BUNDLED / "h200-proof"), speed=10)
    preview = Session(tmp_path / "s").preview({"ppo_mini_batch_size": 2})
    assert preview.mode == "restart" and preview.keeps == RELAUNCH
    store.close()


def test_a_plan_holding_credentials_is_relaunched(runnable_plan):
    """Credentials travel to the runner process only (redact.py): the TaskRunner that rebuilds verl has none."""
    from workbench.plan import Plan

    with_key = Plan.from_verl([*runnable_plan.to_overrides(), "+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=x1"])
    assert judge_change(with_key, {"ppo_mini_batch_size": 2}, gpu_count=1, with_verl=False).keeps == RELAUNCH


def test_a_change_from_an_async_trainer_mode_is_relaunched(runnable_plan):
    """colocate_async generates through the step boundary: its partial rollouts are re-issued by a relaunch's resume."""
    async_plan = runnable_plan.with_changes({"trainer_mode": "colocate_async"})
    assert judge_change(async_plan, {"ppo_mini_batch_size": 2}, gpu_count=1, with_verl=False).keeps == RELAUNCH
    assert judge_change(runnable_plan, {"ppo_mini_batch_size": 2}, gpu_count=1, with_verl=False).keeps == KEEPS_ROLLOUT
    assert judge_change(runnable_plan, {"actor_token_budget": 6000}, gpu_count=1, with_verl=False).keeps == ""  # hot


# ------------------------------------------------------------------ the step boundary
def _rebuild_directive(store: Store, plan, user: int, losses=(), keeps=KEEPS_ROLLOUT) -> None:
    store.put_command(c.RUNNER_REBUILD, c.signed(TOKEN, c.RUNNER_REBUILD, {
        "plan_json": plan.to_json(), "config_yaml": OmegaConf.to_yaml(plan.config), "keeps": keeps,
        "env": {}, "losses": list(losses), "command": user}))


def test_the_boundary_checkpoints_then_opens_the_segment_verl_is_rebuilt_for(tmp_path, runnable_plan):
    store = Store(tmp_path)
    segment = store.begin_segment(runnable_plan.to_json())
    rebuilt, ended = [], []
    boundary = StepBoundary(store, segment, hot_apply=None, checkpoint=lambda step: " (1.5 s)",
                            end_run=lambda: ended.append(True), token=TOKEN,
                            rebuild=lambda payload, seg: rebuilt.append((payload["keeps"], seg)) or "; pruned")
    new = runnable_plan.with_changes({"ppo_mini_batch_size": 2})
    user = store.put_command(c.APPLY, {})
    _rebuild_directive(store, new, user, losses=["critic weights start afresh"])
    assert boundary(4) is True and ended == [True]
    assert boundary.segment_id == segment + 1 and rebuilt == [(KEEPS_ROLLOUT, segment + 1)]
    assert store.segment(segment)["status"] == "done"
    assert store.segment(segment + 1)["resumed_from_step"] == 4
    assert json.loads(store.segment(segment + 1)["plan_json"]) == json.loads(new.to_json())
    events = [e for e in store.rows("events")]
    assert [e["kind"] for e in events] == [c.EV_CHECKPOINT, c.EV_NOT_RESUMED, c.EV_LAUNCHED]
    launched = events[-1]
    assert launched["data"]["in_place"] is True and launched["data"]["segment"] == segment + 1
    assert "rebuilt in place" in launched["text"] and "keeps the vLLM servers" in launched["text"]
    assert launched["text"].endswith("step 4; pruned")
    store.close()


def test_a_rebuild_that_keeps_the_trainer_writes_no_checkpoint(tmp_path, runnable_plan):
    """The trainer's workers keep their models and optimizer states: only the rollout is rebuilt, the run goes on from
    the step it ended on."""
    store = Store(tmp_path)
    segment = store.begin_segment(runnable_plan.to_json())
    saved, rebuilt = [], []
    boundary = StepBoundary(store, segment, hot_apply=None, checkpoint=lambda step: saved.append(step) or "",
                            end_run=lambda: None, token=TOKEN,
                            rebuild=lambda payload, seg: rebuilt.append((payload["keeps"], seg)) or "")
    _rebuild_directive(store, runnable_plan.with_changes({"rollout_max_num_seqs": 64}), store.put_command(c.APPLY, {}),
                       keeps=KEEPS_TRAINER)
    assert boundary(4) is True and saved == [] and rebuilt == [(KEEPS_TRAINER, segment + 1)]
    assert store.segment(segment + 1)["resumed_from_step"] == 4
    events = store.rows("events")
    assert [e["kind"] for e in events] == [c.EV_LAUNCHED]
    assert "keeps the FSDP workers" in events[0]["text"] and "no checkpoint" in events[0]["text"]
    assert "going on after step 4" in events[0]["text"]
    store.close()


def test_a_run_that_cannot_rebuild_or_checkpoint_changes_nothing(tmp_path, runnable_plan):
    store = Store(tmp_path)
    segment = store.begin_segment(runnable_plan.to_json())
    new = runnable_plan.with_changes({"ppo_mini_batch_size": 2})

    def failing_checkpoint(step):
        raise OSError("no space left on device")

    for boundary in (StepBoundary(store, segment, hot_apply=None, checkpoint=lambda step: "", end_run=None,
                                  token=TOKEN),  # a replay: no rebuild
                     StepBoundary(store, segment, hot_apply=None, checkpoint=failing_checkpoint, end_run=None,
                                  token=TOKEN, rebuild=lambda payload, seg: "")):
        user = store.put_command(c.APPLY, {})
        _rebuild_directive(store, new, user)
        assert boundary(4) is False and boundary.segment_id == segment
        assert store.command(user)["state"] == c.NOT_APPLIED
    assert [s["id"] for s in store.rows("segments")] == [segment]
    assert "no space left" in store.rows("events")[-1]["text"]
    store.close()


def test_the_trainer_leaves_its_taskrunner_the_new_config_and_keeps_the_newest_checkpoint(tmp_path, runnable_plan,
                                                                                          monkeypatch):
    from tests.test_runner_boundary import _trainer

    monkeypatch.setenv(c.SESSION_ENV, str(tmp_path))
    for step in (4, 9):
        (tmp_path / c.CHECKPOINT_DIR / f"global_step_{step}").mkdir(parents=True)
    (tmp_path / c.CHECKPOINT_DIR / "latest_checkpointed_iteration.txt").write_text("9")
    trainer = _trainer(runnable_plan)
    new = runnable_plan.with_changes({"ppo_mini_batch_size": 2})
    words = trainer._wb_rebuild({"config_yaml": OmegaConf.to_yaml(new.config), "keeps": KEEPS_ROLLOUT,
                                 "env": {c.SKIP_CRITIC_RESUME_ENV: "1"}}, 3)
    request = trainer.wb_rebuild_request
    assert request == {"segment": 3, "keeps": KEEPS_ROLLOUT, "env": {c.SKIP_CRITIC_RESUME_ENV: "1"},
                       "config_path": str(c.segment_config_path(tmp_path, 3))}
    assert OmegaConf.load(request["config_path"]).actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert list(checkpoints.checkpoint_dirs(tmp_path)) == [9] and "step 4" in words


# ------------------------------------------------------------------ the rebuild's config and kept rollout
def test_a_trainer_kept_through_a_rebuild_fits_on_from_the_step_it_ended_on(runnable_plan):
    """verl's fit loop counts one step past the last it ran and fit counts it again: the kept trainer's next fit
    begins at the step after the boundary, with the run's planned length and a dump executor again."""
    from tests.test_runner_boundary import _trainer

    trainer = _trainer(runnable_plan)
    executors = []
    trainer._init_dump_executor = lambda: executors.append("new")
    trainer.global_steps, trainer.total_training_steps = 4, 100
    trainer._wb_end_run()  # the boundary after step 4
    assert trainer.total_training_steps == 4
    trainer.global_steps += 1  # verl's loop, after the step, before it ends
    trainer.wb_rebuild_request = {"keeps": KEEPS_TRAINER}
    trainer._wb_resume_fit()
    assert (trainer.global_steps, trainer.total_training_steps) == (4, 100)
    assert trainer.wb_rebuild_request is None and executors == ["new"]



def test_a_rebuild_runs_the_new_segment_with_only_its_own_change_environment(tmp_path, runnable_plan, monkeypatch):
    from workbench.runner.rebuild import config_for

    new = runnable_plan.with_changes({"ppo_mini_batch_size": 2})
    path = c.segment_config_path(tmp_path, 5)
    path.parent.mkdir(parents=True)
    path.write_text(OmegaConf.to_yaml(new.config))
    for name, value in ((c.SEGMENT_ENV, "4"), (c.SKIP_CRITIC_RESUME_ENV, "1"), (c.ACTOR_HF_ENV, "/x/huggingface")):
        monkeypatch.setenv(name, value)  # what the launch (an earlier change) left in the TaskRunner
    config = config_for({"segment": 5, "env": {}, "config_path": str(path)}, tmp_path)
    assert os.environ[c.SEGMENT_ENV] == "5"
    assert c.SKIP_CRITIC_RESUME_ENV not in os.environ and c.ACTOR_HF_ENV not in os.environ
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert config.trainer.resume_mode == "auto" and config.trainer.default_local_dir == str(tmp_path / c.CHECKPOINT_DIR)
    assert config.transfer_queue.enable is True


def test_the_kept_rollout_is_handed_to_verls_trainer_bound_to_the_new_workers():
    """verl's trainer_base module stood in for by one with its two names (verl's imports the TransferQueue, which
    this CPU environment lacks)."""
    import types

    from workbench.runner.rebuild import kept_rollout

    trainer_base = types.SimpleNamespace(LLMServerManager="verl's", RewardLoopManager="verl's")

    class Replica:
        world_size, replica_rank, workers = 1, 0, ["old worker"]

        def __init__(self, rank):
            self.replica_rank = rank

    class Owner:
        class llm_server_manager:  # noqa: N801 (verl's attribute name)
            replicas = [Replica(0), Replica(1)]

            @classmethod
            def get_replicas(cls):
                return cls.replicas

        reward_loop_manager = object()

    class WorkerGroup:
        workers = ["new worker 0", "new worker 1"]

    originals = trainer_base.LLMServerManager, trainer_base.RewardLoopManager
    with kept_rollout(Owner, trainer_base):
        servers = trainer_base.LLMServerManager.create(config={}, worker_group=WorkerGroup, rollout_resource_pool="pool")
        reward = trainer_base.RewardLoopManager(config={}, rm_resource_pool=None)
    assert servers is Owner.llm_server_manager and reward is Owner.reward_loop_manager
    assert [r.workers for r in servers.replicas] == [["new worker 0"], ["new worker 1"]]
    assert (trainer_base.LLMServerManager, trainer_base.RewardLoopManager) == originals


class FakeActor:
    """A Ray actor handle's face to the rebuild: `__ray_call__.remote(fn)` runs fn on `target` here."""

    def __init__(self, name, target=None):
        self.name, self.target = name, target
        self.__ray_call__ = types.SimpleNamespace(remote=lambda fn: fn(self.target))

    def __repr__(self):
        return self.name


@pytest.fixture
def kept_trainer(tmp_path, runnable_plan, monkeypatch):
    """A trainer after the boundary ended its fit at step 4 for a rollout change, with stand-ins for Ray, its FSDP
    workers (each with a vLLM ServerAdapter), the servers, router, agent loops and reward workers."""
    import ray

    from tests.test_runner_boundary import _trainer
    from workbench.runner import rebuild

    calls, killed, waits = [], [], {}
    monkeypatch.setenv(c.SESSION_ENV, str(tmp_path))
    monkeypatch.setattr(ray, "kill", lambda handle, no_restart: killed.append(handle.name))
    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray.actor, "ActorHandle", FakeActor)
    monkeypatch.setattr(rebuild, "_process_trees", lambda actors: ([a.name for a in actors], {101, 102, 103}))
    monkeypatch.setattr(rebuild, "_wait_names_free", lambda names: waits.setdefault("names", names))
    monkeypatch.setattr(rebuild, "_wait_gpu_free", lambda done: waits.setdefault("gpu", done))
    new = runnable_plan.with_changes({"rollout_max_num_seqs": 64})
    path = c.segment_config_path(tmp_path, 3)
    path.parent.mkdir(parents=True)
    path.write_text(OmegaConf.to_yaml(new.config))

    adapters = [types.SimpleNamespace(server_handle="old server", _delta_weight_transfer_engine_initialized=True)
                for _ in range(2)]
    fsdp = [FakeActor(f"fsdp{i}", types.SimpleNamespace(worker_dict={"actor_rollout": types.SimpleNamespace(
        rollout=adapters[i])})) for i in range(2)]
    old = types.SimpleNamespace(
        get_replicas=lambda: [types.SimpleNamespace(servers=[FakeActor("server0")])],
        global_load_balancer=FakeActor("router"), rollout_resource_pool="pool")
    reward = types.SimpleNamespace(reward_loop_workers=[FakeActor("reward")])
    trainer = _trainer(runnable_plan)
    trainer.global_steps, trainer._wb_planned_steps, trainer.total_training_steps = 5, 100, 4
    trainer.wb_rebuild_request = {"keeps": KEEPS_TRAINER}
    trainer._wb_step_offset = 0
    trainer._init_dump_executor = lambda: calls.append("dump executor")
    trainer.actor_rollout_wg = types.SimpleNamespace(workers=fsdp)
    trainer.llm_server_manager, trainer.reward_loop_manager = old, reward
    trainer.checkpoint_manager = types.SimpleNamespace(replicas=["old replica"],
                                                       sleep_replicas=lambda: calls.append("sleep"))
    trainer.on_init_end = lambda: calls.append(("ready", trainer.global_steps))
    runner = types.SimpleNamespace(agent_loop_manager=types.SimpleNamespace(agent_loop_workers=[FakeActor("loop0")]),
                                   init_agent_loop_manager=lambda: calls.append("agent loops"))

    class ServerManager:
        @staticmethod
        def create(config, worker_group, rollout_resource_pool):
            calls.append(("servers", config.actor_rollout_ref.rollout.max_num_seqs, worker_group is
                          trainer.actor_rollout_wg, rollout_resource_pool,
                          [a.server_handle for a in adapters]))
            return types.SimpleNamespace(get_replicas=lambda: ["new replica"])

    request = {"segment": 3, "keeps": KEEPS_TRAINER, "env": {}, "config_path": str(path)}
    return types.SimpleNamespace(trainer=trainer, runner=runner, request=request, server_manager=ServerManager,
                                 calls=calls, killed=killed, waits=waits, adapters=adapters, reward=reward)


def test_a_rollout_change_rebuilds_the_rollout_beside_the_kept_trainer(kept_trainer):
    from workbench.runner.rebuild import rebuild_rollout

    k = kept_trainer
    owner = rebuild_rollout(k.runner, k.trainer, k.trainer, k.request, server_manager=k.server_manager)
    assert owner is k.trainer
    assert k.killed == ["server0", "router", "loop0"]  # not the FSDP workers, not the reward workers
    assert k.waits["names"] == ["server0", "router"]
    assert k.waits["gpu"]({7}) and not k.waits["gpu"]({7, 102})  # until no killed process holds the GPU
    assert k.trainer.config.actor_rollout_ref.rollout.max_num_seqs == 64 and os.environ[c.SEGMENT_ENV] == "3"
    assert k.calls == ["dump executor", ("servers", 64, True, "pool", ["old server", "old server"]),
                       "sleep", "agent loops", ("ready", 4)]
    assert [a.server_handle for a in k.adapters] == [None, None]  # looked up again by name
    assert not any(a._delta_weight_transfer_engine_initialized for a in k.adapters)
    assert k.trainer.checkpoint_manager.replicas == ["new replica"]
    assert k.trainer.reward_loop_manager is k.reward and k.trainer.wb_rebuild_request is None
    assert (k.trainer.global_steps, k.trainer.total_training_steps) == (4, 100)


def test_a_failed_rollout_rebuild_checkpoints_the_kept_trainer_for_the_relaunch(kept_trainer, tmp_path):
    from workbench.runner.rebuild import rebuild_rollout

    k = kept_trainer
    k.trainer._wb_store = Store(tmp_path)
    saved = []
    k.trainer._wb_checkpoint = lambda step: saved.append((step, k.trainer.global_steps)) or " (2.0 s)"

    def no_room(**_):
        raise RuntimeError("vLLM: not enough GPU memory for the KV cache")

    k.server_manager.create = no_room
    with pytest.raises(RuntimeError, match="KV cache"):
        rebuild_rollout(k.runner, k.trainer, k.trainer, k.request, server_manager=k.server_manager)
    assert saved == [(4, 4)]
    event = k.trainer._wb_store.rows("events")[-1]
    assert event["kind"] == c.EV_CHECKPOINT
    assert event["text"] == "checkpoint at step 4 (2.0 s), after the failed rebuild"
    k.trainer._wb_store.close()


# ------------------------------------------------------------------ the supervisor
class StubRun(Run):
    """A live run's face to the supervisor, without verl: it rebuilds in place, and exits with `rc` when told."""

    rebuilds_in_place = True
    log_path = None

    def __init__(self):
        self.rc = None

    def poll(self):
        return self.rc

    def kill(self):
        pass


@pytest.fixture
def supervised(tmp_path, runnable_plan):
    from workbench.supervisor import Supervisor

    (tmp_path / c.TOKEN_FILE).write_text(TOKEN)
    store = Store(tmp_path)
    store.set_meta(state=c.RUNNING, initial_plan=runnable_plan.to_json())
    runs = []
    supervisor = Supervisor(tmp_path, run_factory=lambda segment, plan, env: runs.append((segment, plan, env))
                            or StubRun())
    supervisor.warmed.wait(60)
    supervisor.launch(runnable_plan, reason="start")
    yield supervisor, store, runs
    store.close()


def _apply(supervisor, store, changes) -> int:
    command = store.put_command(c.APPLY, {"changes": changes})
    supervisor.cmd_apply(command, {"changes": changes})
    return command


def _runner_starts(store: Store, segment: int, first_step: int) -> None:
    store.add_event(c.EV_STARTED, f"verl is ready at step {first_step}", {"segment": segment, "first_step": first_step})


def test_a_change_verl_takes_in_place_is_sent_as_a_rebuild_and_resumes_on_the_runners_segment(supervised):
    supervisor, store, runs = supervised
    command = _apply(supervisor, store, {"ppo_mini_batch_size": 2})
    directive = store.commands_in([c.QUEUED], kinds=[c.RUNNER_REBUILD])[0]
    payload = directive["payload"]
    assert c.SignatureCheck(TOKEN).refusal(c.RUNNER_REBUILD, payload) is None
    assert payload["keeps"] == KEEPS_ROLLOUT and payload["command"] == command
    assert OmegaConf.create(payload["config_yaml"]).actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert store.command(command)["state"] == c.RESTARTING and supervisor.state() == c.RESTARTING
    assert json.loads(store.command(command)["result"])["keeps"] == KEEPS_ROLLOUT  # what a handle says (keeps)
    pending = [e for e in store.rows("events") if e["kind"] == c.EV_RESTART_PENDING][-1]
    assert "rebuild verl in place (keeps the vLLM servers" in pending["text"]
    assert not store.commands_in([c.QUEUED], kinds=[c.RUNNER_CHECKPOINT_EXIT])
    # the runner: checkpoint, the new segment, verl rebuilt and ready
    segment = store.begin_segment(json.loads(json.dumps(payload["plan_json"])), reason="restart-class change",
                                  resumed_from_step=4)
    supervisor.check_resumed()
    assert store.command(command)["state"] == c.RESTARTING  # not before verl is ready
    _runner_starts(store, segment, 5)
    supervisor.check_resumed()
    result = json.loads(store.command(command)["result"])
    assert store.command(command)["state"] == c.RESUMED and result["segment"] == segment and result["step"] == 5
    assert supervisor.pending_plan is None and len(runs) == 1  # nothing relaunched
    _apply(supervisor, store, {"critic_lora_rank": 8})  # the next restart-class change is taken
    assert len(store.commands_in([c.QUEUED], kinds=[c.RUNNER_REBUILD])) == 2


def test_a_rebuild_that_fails_before_verl_is_ready_is_relaunched_instead(supervised):
    supervisor, store, runs = supervised
    command = _apply(supervisor, store, {"ppo_mini_batch_size": 2})
    payload = store.commands_in([c.QUEUED], kinds=[c.RUNNER_REBUILD])[0]["payload"]
    rebuilt = store.begin_segment(payload["plan_json"], reason="restart-class change", resumed_from_step=4)
    store.add_event(c.EV_REBUILD_FAILED, "rebuilding verl in place failed (RuntimeError('x')): relaunching instead",
                    {"segment": rebuilt})
    supervisor.run.rc = 1
    supervisor.check_run()
    assert store.segment(rebuilt)["status"] == "failed"
    assert len(runs) == 2 and runs[1][1].knob_values()["ppo_mini_batch_size"] == 2
    relaunched = runs[1][0]
    assert relaunched == rebuilt + 1 and supervisor.state() == c.STARTING
    assert not [e for e in store.rows("events") if e["kind"] == c.EV_CRASH]
    _runner_starts(store, relaunched, 5)
    supervisor.check_resumed()
    assert store.command(command)["state"] == c.RESUMED
    assert json.loads(store.command(command)["result"])["segment"] == relaunched


def test_a_change_only_new_processes_take_and_the_switch_off_are_relaunched(supervised, monkeypatch):
    supervisor, store, runs = supervised
    relaunched = _apply(supervisor, store, {"nccl_env": {"NCCL_P2P_DISABLE": "1"}})
    assert store.commands_in([c.QUEUED], kinds=[c.RUNNER_CHECKPOINT_EXIT])
    assert json.loads(store.command(relaunched)["result"])["keeps"] == RELAUNCH
    supervisor.run.rc = 0
    supervisor.check_run()  # the runner checkpointed and exited: relaunched
    assert len(runs) == 2
    _runner_starts(store, runs[1][0], 5)
    supervisor.check_resumed()
    monkeypatch.setenv("WORKBENCH_IN_PLACE", "0")
    _apply(supervisor, store, {"ppo_mini_batch_size": 2})
    assert not store.commands_in([c.QUEUED], kinds=[c.RUNNER_REBUILD])
    assert len(store.commands_in([c.QUEUED], kinds=[c.RUNNER_CHECKPOINT_EXIT])) == 2


# ------------------------------------------------------------------ what the page shows
def test_the_changes_panel_follows_an_in_place_rebuild_by_its_own_stages():
    import time
    from types import SimpleNamespace

    import pandas as pd

    from widgets.changes import ChangesPanel, Tracked

    now = time.time()
    events = pd.DataFrame([{"t": now + 1, "kind": c.EV_CHECKPOINT, "text": "checkpoint at step 2 (19.7 s)"},
                           {"t": now + 2, "kind": c.EV_LAUNCHED, "text": "segment 2 rebuilt in place"}])
    handle = SimpleNamespace(state="restarting", mode="restart", keeps=KEEPS_ROLLOUT, done=False, problems={},
                             message="restarting: checkpoint at the next step boundary, then rebuild verl in place")
    markup, _, done = ChangesPanel._progress(None, Tracked(handle, "LoRA alpha", pressed_at=now), handle, events)
    assert "✓ checkpoint at the step boundary" in markup and "✓ rebuild verl in place with the new plan" in markup
    assert "rebuilding verl in place:" in markup and "start-up took" not in markup and not done


def test_the_changes_panel_says_a_rollout_change_rebuilds_the_rollout_without_a_checkpoint():
    import time
    from types import SimpleNamespace

    import pandas as pd

    from widgets.changes import ChangesPanel, Tracked

    now = time.time()
    events = pd.DataFrame([{"t": now + 1, "kind": c.EV_LAUNCHED, "text": "segment 2 rebuilt in place"}])
    handle = SimpleNamespace(state="restarting", mode="restart", keeps=KEEPS_TRAINER, done=False, problems={},
                             message="restarting: at the next step boundary, rebuild the rollout in place")
    markup, _, done = ChangesPanel._progress(None, Tracked(handle, "rollout memory", pressed_at=now), handle, events)
    assert "checkpoint" not in markup.replace("no checkpoint", "") and not done
    assert "✓ rebuild the rollout in place with the new plan" in markup
    assert "rebuilding the rollout in place:" in markup


def test_the_supervisor_and_a_handle_say_a_rollout_change_writes_no_checkpoint(supervised):
    supervisor, store, runs = supervised
    command = _apply(supervisor, store, {"rollout_max_num_seqs": 64})
    assert store.commands_in([c.QUEUED], kinds=[c.RUNNER_REBUILD])[0]["payload"]["keeps"] == KEEPS_TRAINER
    pending = [e for e in store.rows("events") if e["kind"] == c.EV_RESTART_PENDING][-1]
    assert "rebuild the rollout in place (no checkpoint) (keeps the FSDP workers" in pending["text"]
    from workbench.handles import ApplyResult

    class Source:
        id, state, failure = "s", c.RUNNING, None

        @staticmethod
        def command(command_id):
            return store.command(command_id)

        @staticmethod
        def supervisor_alive():
            return True

    handle = ApplyResult(Source, command, "restart", {"rollout_max_num_seqs": 64}).refresh()
    assert handle.state == "restarting" and handle.keeps == KEEPS_TRAINER
    assert handle.message == ("restarting: at the next step boundary, rebuild the rollout in place (no checkpoint) "
                              "with rollout_max_num_seqs=64")
