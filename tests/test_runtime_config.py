"""What the runner adds to a plan's verl config before it starts verl (CPU: no verl import needed)."""

import os
from pathlib import Path

from omegaconf import OmegaConf

from tests.plan_fixtures import runnable_plan, tiny_model  # noqa: F401 (fixtures)
from workbench.runner import runtime, worker_hooks


def verl_like_config():
    # The parts of verl's composed ppo_trainer config that runtime_config touches, with verl's default values.
    return OmegaConf.create(
        {
            "trainer": {"default_local_dir": "checkpoints/x", "resume_mode": "auto"},
            "actor_rollout_ref": {
                "model": {"path": "/m", "use_remove_padding": True, "override_config": {}},
                "actor": {"checkpoint": {"save_contents": ["model", "optimizer", "extra"]}},
            },
            "critic": {"model": {"path": "/m", "use_remove_padding": True, "override_config": {}}},
            "ray_kwargs": {"ray_init": {"num_cpus": None, "runtime_env": {"py_executable": None}}},
        }
    )


def test_runtime_config_points_verl_at_the_session(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SEGMENT_ID", "3")
    monkeypatch.delenv(runtime.ACTOR_HF_ENV, raising=False)
    monkeypatch.delenv(runtime.ACTOR_HF_EXPORT_ENV, raising=False)
    config, _ = runtime.runtime_config(verl_like_config(), tmp_path)
    assert config.trainer.default_local_dir == str(tmp_path / "checkpoints")
    assert config.trainer.resume_mode == "auto"
    assert "hf_model" in config.actor_rollout_ref.actor.checkpoint.save_contents  # unless the supervisor says no
    env = config.ray_kwargs.ray_init.runtime_env
    assert env.worker_process_setup_hook == "workbench.runner.worker_hooks.setup"
    assert env.env_vars.WORKBENCH_SEGMENT_ID == "3"
    package_root = str(Path(runtime.__file__).resolve().parents[2])
    assert package_root in env.env_vars.PYTHONPATH.split(os.pathsep)


def test_runtime_config_without_flash_attn_uses_sdpa(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "flash_attn_available", lambda: False)
    config, notes = runtime.runtime_config(verl_like_config(), tmp_path)
    for model in (config.actor_rollout_ref.model, config.critic.model):
        assert model.use_remove_padding is False
        assert model.override_config.attn_implementation == "sdpa"
    assert any("flash-attn" in n for n in notes)


def test_runtime_config_with_flash_attn_leaves_attention_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "flash_attn_available", lambda: True)
    config, notes = runtime.runtime_config(verl_like_config(), tmp_path)
    assert config.actor_rollout_ref.model.use_remove_padding is True
    assert "attn_implementation" not in config.critic.model.override_config
    assert not notes


def test_restart_from_hf_weights_disables_shard_resume(tmp_path, monkeypatch):
    monkeypatch.setenv(runtime.ACTOR_HF_ENV, "/ckpt/global_step_7/actor/huggingface")
    config, notes = runtime.runtime_config(verl_like_config(), tmp_path)
    assert config.actor_rollout_ref.model.path == "/ckpt/global_step_7/actor/huggingface"
    assert config.trainer.resume_mode == "disable"
    assert any("GPU count changed" in n for n in notes)


def test_flash_attn_probe_matches_the_environment():
    import importlib.util

    assert worker_hooks.flash_attn_available() == (importlib.util.find_spec("flash_attn") is not None)


def test_a_run_on_one_gpu_saves_no_hf_export(tmp_path, monkeypatch):
    """The export only serves a restart onto another GPU count; the supervisor says when none can come
    (runs.write_segment_config), and the checkpoint holds verl's own contents only."""
    monkeypatch.setenv(runtime.ACTOR_HF_EXPORT_ENV, "0")
    config, _ = runtime.runtime_config(verl_like_config(), tmp_path)
    assert list(config.actor_rollout_ref.actor.checkpoint.save_contents) == ["model", "optimizer", "extra"]


def test_the_segment_environment_says_whether_the_hf_export_is_needed(tmp_path, runnable_plan, monkeypatch):
    from workbench import runs

    for gpus, export in ((1, "0"), (2, "1"), (None, "1")):
        monkeypatch.setattr(runs, "gpu_count", lambda: gpus)
        env = runs.write_segment_config(tmp_path, 1, runnable_plan)
        assert env[runtime.ACTOR_HF_EXPORT_ENV] == export
