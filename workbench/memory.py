"""Peak GPU memory of a plan, per role and phase, from the model's dimensions — so it scales with the model.

What a verl 0.9.1 FSDP run holds on a GPU (read from verl's engine: workers/engine/fsdp/transformer_impl.py):
- each trainable role (actor, critic) keeps fp32 parameters and Adam's two fp32 moments, 12 bytes a parameter,
  sharded over its FSDP ranks; parameter / optimizer offload moves them to the CPU while another role works;
  its fp32 gradients (4 bytes a parameter) live only during its own update (verl zeroes them on leaving train mode);
  a LoRA critic keeps its frozen base (4 bytes a parameter) and trains only small adapters;
- the reference policy (when the algorithm runs one) keeps bf16 parameters, 2 bytes a parameter;
- per token of a micro batch, a pass holds activations (every layer's with gradients; each layer's input plus one
  layer's with gradient checkpointing; one layer's in a no-grad pass) and, without fused kernels, the
  full-vocabulary logits of the log-prob passes (bf16 logits, fp32 log-softmax and entropy: bytes × vocabulary);
  a micro batch holds the token budget with dynamic batching, else sequences × the longest sequence; without
  remove-padding (no flash-attn) the padded length counts, not the real one;
- the actor, reference and critic share one process per GPU unless the critic has GPUs of its own; PyTorch's cache
  adds to what is allocated (ALLOCATOR_GIB) and each process has a CUDA context;
- the rollout engine (vLLM) takes its memory share of the GPU while it generates and sleeps during training.
The GPU peak is the larger of generation time (rollout share + the trainer's resident state) and training time
(the trainer's peak + what the sleeping engine and the other processes keep).

The coefficients (COEFFICIENTS) were fit on real H200 measurements of the 0.5B shape and checked against the
≈1.5B figures of the 2026-12-01 campaign; `calibrate` refits the activation scale to a session's own segments and
raises it where a crash shows a plan needed more than the GPU had (a crash is a lower bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd

from .knobs import KNOBS

GIB = float(2**30)
MIB_PER_GIB = 1024.0
DEFAULT_BATCHED_TOKENS = 8192  # verl's rollout.max_num_batched_tokens
OOM_LINE_SHARE = 0.95  # a peak from here on is an out-of-memory: the cache can't always be reclaimed in time



@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide a Qwen2-style model's memory (HF config.json names)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = True
    source: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None, source: str) -> "ModelShape | None":
        """From an HF config (or the `model_shape` a session's meta records); None when a dimension is missing."""
        if not config:
            return None
        try:
            dims = {name: int(config[name]) for name in (
                "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")}
        except (KeyError, TypeError, ValueError):
            return None
        kv = config.get("num_key_value_heads") or dims["num_attention_heads"]
        return cls(**dims, num_key_value_heads=int(kv),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", True)), source=source)

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * (self.hidden_size // self.num_attention_heads)

    @property
    def layer_params(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_width
        return (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h  # q, k, v (biased), o, MLP, 2 norms

    @property
    def policy_params(self) -> int:
        """The causal LM (actor, reference)."""
        body = self.num_hidden_layers * self.layer_params + self.vocab_size * self.hidden_size + self.hidden_size
        return body + (0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size)

    @property
    def value_params(self) -> int:
        """The critic: the same body with a one-output value head instead of the LM head."""
        return self.num_hidden_layers * self.layer_params + self.vocab_size * self.hidden_size + 2 * self.hidden_size

    @property
    def layer_activation_bytes(self) -> int:
        """Bytes one layer keeps per token for its backward pass (bf16 tensors, fp32 RMSNorms; attention by a
        memory-efficient kernel, so no sequence² term): the structural count COEFFICIENTS.activation scales."""
        return 30 * self.hidden_size + 8 * self.intermediate_size + 4 * self.kv_width

    def activation_bytes(self, checkpointing: bool) -> float:
        """Per token of a pass with gradients."""
        if checkpointing:
            return 2 * self.hidden_size * self.num_hidden_layers + self.layer_activation_bytes
        return float(self.num_hidden_layers * self.layer_activation_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "source"}


# Published Qwen2.5 dimensions, to infer a shape from measured memory when a session recorded none.
KNOWN_SHAPES = {
    "qwen2.5-0.5b": ModelShape(896, 24, 14, 2, 4864, 151936, True, "Qwen2.5-0.5B dimensions"),
    "qwen2.5-1.5b": ModelShape(1536, 28, 12, 2, 8960, 151936, True, "Qwen2.5-1.5B dimensions"),
    "qwen2.5-3b": ModelShape(2048, 36, 16, 2, 11008, 151936, True, "Qwen2.5-3B dimensions"),
    "qwen2.5-7b": ModelShape(3584, 28, 28, 4, 18944, 152064, False, "Qwen2.5-7B dimensions"),
}


@dataclass(frozen=True)
class Coefficients:
    """What the structural counts don't know, fit on real runs (see COEFFICIENTS)."""

    activation: float  # measured / structural activation bytes
    logits_train: float  # bytes per token × vocabulary entry in the actor's update without fused kernels
    logits_infer: float  # … in a no-grad log-prob pass (old log-prob, reference)
    allocator_gib: float  # PyTorch's cache: max reserved − max allocated
    context_gib: float  # CUDA context and NCCL buffers per process (NVML − reserved)
    rollout_extra_gib: float  # the rollout engine's NVML peak above its memory share
    others_gib: float  # what the sleeping rollout engine and the driver processes keep during training
    uncertainty: float  # one-sided relative band on the variable part (activations, logits)
    floor_gib: float  # and on the whole peak, whatever the model
    source: str = ""
    rollout_activation: float = 1.0  # scale on the rollout engine's profiling pass (raised by a crash there)


COEFFICIENTS = Coefficients(
    activation=0.9, logits_train=4.0, logits_infer=13.0, allocator_gib=8.0, context_gib=1.3,
    rollout_extra_gib=2.0, others_gib=4.3, uncertainty=0.15, floor_gib=2.0,
    source="fit on 13 real H200 trainer peaks of the 0.5B shape (2026-11-30 and 2026-12-01: quickstart, tuned, "
           "fused-kernel, LoRA-critic and budget changes; max |error| 6 %, median 0.5 %), checked on the ≈1.5B "
           "quickstart and its out-of-memory crash (2026-12-01)")


@dataclass(frozen=True)
class Roles:
    """Which optional roles run (verl decides from the algorithm; the advisor never changes it)."""

    critic: bool = True
    ref: bool = False


@dataclass(frozen=True)
class Pass:
    phase: str  # verl's timing_s/<phase>
    role: str
    grad: bool
    budget: str  # the knob sizing its micro batches with dynamic batching
    micro: str  # … without
    logits: bool  # a log-prob pass over the vocabulary


def _sizing(phase: str, unit: str) -> str:
    """The knob that sizes a phase's micro batches in `unit` (the knob table says which phases each moves)."""
    return next(n for n, k in KNOBS.items() if k.micro_batch_unit == unit and phase in k.phases)


# The trainer's passes (verl's timing_s/<phase>): who runs them, with gradients or not, over the vocabulary or not.
PASSES = tuple(Pass(phase, role, grad, _sizing(phase, "tokens"), _sizing(phase, "sequences"), logits)
               for phase, role, grad, logits in (
                   ("old_log_prob", "actor", False, True), ("ref", "ref", False, True),
                   ("values", "critic", False, False), ("update_critic", "critic", True, False),
                   ("update_actor", "actor", True, True)))
PHASE_ROLE = {p.phase: p.role for p in PASSES}


@dataclass(frozen=True)
class Sequences:
    """How a segment's sequences sit in memory: their mean real prompt and response lengths and how many a step
    trains (verl's prompt_length/mean, response_length/mean, perf/total_num_tokens; NaN: unknown, then every
    sequence is taken at its longest and a step at train_batch_size sequences), and whether they are padded (no
    remove-padding: verl's runner falls back to it without flash-attn; None: as the plan's remove_padding says)."""

    prompt: float = math.nan
    response: float = math.nan
    count: float = math.nan
    padded: bool | None = None


# Without remove-padding verl pads each micro batch to its longest sequence (transformer_impl.prepare_model_inputs):
# the real mean plus this share of the way to the longest allowed length (fit: H200, 0.5B shape, 2026-11-30/12-01).
PADDING_SHARE = 0.15


def micro_batch_tokens(knobs: Mapping[str, Any], p: Pass, sequences: Sequences = Sequences()) -> float:
    """Tokens the largest micro batch of pass `p` holds in memory. A no-grad pass splits the whole step's
    sequences, an update one mini batch's: by the token budget with dynamic batching, else by a fixed number of
    sequences."""
    longest = int(knobs["max_prompt_length"]) + int(knobs["max_response_length"])
    real = sequences.prompt + sequences.response
    real = real if real > 0 else float(longest)
    padded = (not knobs.get("remove_padding", True)) if sequences.padded is None else sequences.padded
    held = real + PADDING_SHARE * max(0.0, longest - real) if padded else real
    per_step = sequences.count if sequences.count > 0 else float(knobs["train_batch_size"])
    count = per_step * (int(knobs["ppo_mini_batch_size"]) / int(knobs["train_batch_size"]) if p.grad else 1.0)
    if knobs["use_dynamic_bsz"] or knobs.get(p.micro) is None:
        # At most the budget; verl balances the micro batches, but the largest is taken (what the peak needs).
        return min(float(knobs[p.budget]), count * real) * held / real
    return min(float(knobs[p.micro]), count) * held


@dataclass(frozen=True)
class MemoryPrediction:
    """Peak memory of one plan per GPU (GiB): per pass, per process, and the GPU's at generation and training."""

    phases: pd.DataFrame  # phase, role, process, tokens, resident_gib, transient_gib, allocated_gib
    process_allocated_gib: dict[str, float]
    process_reserved_gib: dict[str, float]
    gen_peak_gib: float
    train_peak_gib: float
    band_gib: float
    mem_total_gib: float
    shape: ModelShape
    coefficients: Coefficients
    notes: tuple[str, ...] = ()

    @property
    def gpu_peak_gib(self) -> float:
        return max(self.gen_peak_gib, self.train_peak_gib)

    @property
    def upper_gib(self) -> float:
        return self.gpu_peak_gib + self.band_gib

    @property
    def oom_line_gib(self) -> float:
        return OOM_LINE_SHARE * self.mem_total_gib

    @property
    def fits(self) -> bool:
        """Whether the peak, its upper band included, stays under the out-of-memory line (True when the GPU's
        size is unknown: nothing to judge against)."""
        return not self.mem_total_gib > 0 or self.upper_gib < self.oom_line_gib

    @property
    def peak_phase(self) -> str:
        """Where the peak falls: generation, or the pass with the largest allocation."""
        if self.gen_peak_gib >= self.train_peak_gib or self.phases.empty:
            return "gen"
        return str(self.phases.loc[self.phases["allocated_gib"].idxmax(), "phase"])

    def phase_gib(self, phase: str) -> float:
        """What the process running `phase` holds at its peak in that phase (NaN when the plan doesn't run it)."""
        row = self.phases[self.phases["phase"] == phase]
        return float(row["allocated_gib"].iloc[0]) if len(row) else math.nan

    @property
    def text(self) -> str:
        where = "generation" if self.peak_phase == "gen" else self.peak_phase
        share = f" of {self.mem_total_gib:.0f} GiB" if self.mem_total_gib > 0 else ""
        return f"peak {self.gpu_peak_gib:.0f} ± {self.band_gib:.0f} GiB{share} (in {where})"


def _world(knobs: Mapping[str, Any]) -> dict[str, int]:
    """FSDP ranks of the trainer processes (actor + ref, critic) and their process names."""
    gpus = len(knobs["gpus"])
    critic_own = int(knobs.get("critic_gpus") or 0)
    trainer = max(1, gpus - critic_own - int(knobs.get("reward_gpus") or 0) - int(knobs.get("rollout_gpus") or 0))
    return {"actor": trainer, "ref": trainer, "critic": critic_own or trainer}


def process_of(role: str, knobs: Mapping[str, Any]) -> str:
    """The trainer process a role runs in: one colocated process unless the critic has GPUs of its own."""
    if role == "critic" and int(knobs.get("critic_gpus") or 0) > 0:
        return "critic"
    return "actor_rollout_ref+critic" if int(knobs.get("critic_gpus") or 0) == 0 else "actor_rollout_ref"


def _state_bytes(role: str, knobs: Mapping[str, Any], shape: ModelShape, active: bool, training: bool) -> float:
    """Bytes of a role's parameters, gradients and optimizer state on one of its GPUs."""
    world = _world(knobs)[role]
    if role == "ref":
        offloaded = knobs.get("ref_param_offload") and not active
        return 0.0 if offloaded else 2.0 * shape.policy_params / world
    params = shape.policy_params if role == "actor" else shape.value_params
    lora = role == "critic" and int(knobs.get("critic_lora_rank") or 0) > 0
    param_off = knobs.get(f"{role}_param_offload") and not active
    optim_off = knobs.get(f"{role}_optimizer_offload") and not (active and training)
    weights = 0.0 if param_off else 4.0
    optimizer = 0.0 if (optim_off or lora) else 8.0
    grads = 4.0 if (active and training and not lora) else 0.0
    return (weights + optimizer + grads) * params / world


def _transient_bytes(p: Pass, knobs: Mapping[str, Any], shape: ModelShape, coef: Coefficients,
                     tokens: float) -> float:
    if p.grad:
        activations = shape.activation_bytes(bool(knobs["gradient_checkpointing"]))
    else:
        activations = shape.layer_activation_bytes  # one layer at a time
    logits = 0.0
    if p.logits:
        if knobs["fused_kernels"]:
            logits = 2.0 * shape.hidden_size  # the last hidden states; the lm-head runs in chunks
        else:
            logits = (coef.logits_train if p.grad else coef.logits_infer) * shape.vocab_size
    return tokens * (coef.activation * activations + logits)


def rollout_floor_gib(knobs: Mapping[str, Any], shape: ModelShape, coef: Coefficients) -> float:
    """What the rollout engine needs whatever its memory share: its bf16 weights (over its tensor-parallel GPUs)
    and the forward pass over max_num_batched_tokens it profiles at start-up (bf16 hidden states, q/k/v and the
    MLP's gate and up projections per token). More than its share, and vLLM has no room for its KV cache."""
    tokens = float(knobs.get("rollout_max_batched_tokens") or DEFAULT_BATCHED_TOKENS)
    per_token = 2.0 * (4 * shape.hidden_size + 3 * shape.intermediate_size)
    weights = 2.0 * shape.policy_params / int(knobs.get("rollout_tp") or 1)
    return (weights + coef.rollout_activation * tokens * per_token) / GIB


def kv_cache_tokens(knobs: Mapping[str, Any], shape: ModelShape, mem_total_gib: float,
                    coef: Coefficients = COEFFICIENTS) -> float:
    """Tokens the rollout engine's KV cache holds per GPU: its memory share less what it needs whatever the share
    (rollout_floor_gib), over one token's keys and values (bf16, every layer, its tensor-parallel slice). On the
    H200 at 0.4 for the 0.5B shape this gives 4.8 M tokens where vLLM 0.24 logged "GPU KV cache size: 4,689,264
    tokens" (bench/results/h200_2026-12-02/campaign_logs.tar.gz, segment-1.log: it also holds back its CUDA graphs)."""
    kv_gib = float(knobs["rollout_gpu_memory"]) * mem_total_gib - rollout_floor_gib(knobs, shape, coef)
    bytes_per_token = 2 * 2 * shape.num_hidden_layers * shape.kv_width / int(knobs.get("rollout_tp") or 1)
    return max(0.0, kv_gib * GIB / bytes_per_token)


def predict_memory(knobs: Mapping[str, Any], shape: ModelShape, mem_total_gib: float, *,
                   coefficients: Coefficients = COEFFICIENTS, roles: Roles = Roles(),
                   sequences: Sequences = Sequences(), critic_shape: ModelShape | None = None) -> MemoryPrediction:
    """The plan with knob values `knobs` on a GPU of `mem_total_gib` (NaN: unknown); the critic's model has
    `critic_shape` when it differs from the policy's."""
    coef = coefficients

    def of(role: str) -> ModelShape:
        return critic_shape if role == "critic" and critic_shape is not None else shape

    running = [p for p in PASSES if (p.role != "critic" or roles.critic) and (p.role != "ref" or roles.ref)]
    in_process: dict[str, list[str]] = {}
    for role in ("actor", "ref", "critic"):
        if role == "actor" or getattr(roles, role):
            in_process.setdefault(process_of(role, knobs), []).append(role)
    rows = []
    for p in running:
        process = process_of(p.role, knobs)
        resident = sum(_state_bytes(r, knobs, of(r), active=(r == p.role), training=p.grad)
                       for r in in_process[process])
        tokens = micro_batch_tokens(knobs, p, sequences)
        transient = _transient_bytes(p, knobs, of(p.role), coef, tokens)
        rows.append({"phase": p.phase, "role": p.role, "process": process, "tokens": tokens,
                     "resident_gib": resident / GIB, "transient_gib": transient / GIB,
                     "allocated_gib": (resident + transient) / GIB})
    phases = pd.DataFrame(rows, columns=["phase", "role", "process", "tokens", "resident_gib", "transient_gib",
                                         "allocated_gib"])
    allocated = phases.groupby("process")["allocated_gib"].max().to_dict()
    reserved = {proc: gib + coef.allocator_gib for proc, gib in allocated.items()}
    idle = {proc: sum(_state_bytes(r, knobs, of(r), active=False, training=False) for r in roles_) / GIB
            for proc, roles_ in in_process.items()}
    colocated_rollout = not (knobs.get("trainer_mode") == "separate_async" and int(knobs.get("rollout_gpus") or 0))
    trainer_gpu = process_of("actor", knobs)
    rollout_gib = max(float(knobs["rollout_gpu_memory"]) * mem_total_gib, rollout_floor_gib(knobs, shape, coef)) \
        + coef.rollout_extra_gib if mem_total_gib > 0 else math.nan
    gen = (rollout_gib if colocated_rollout else 0.0) + idle[trainer_gpu] + coef.context_gib + coef.others_gib
    train = max(reserved[proc] + coef.context_gib for proc in reserved) + coef.others_gib
    variable = float(phases["transient_gib"].max()) if len(phases) else 0.0
    band = max(coef.floor_gib, coef.uncertainty * variable)
    notes = []
    if not colocated_rollout:
        notes.append("the rollout engine has GPUs of its own: only the trainer's memory is predicted here")
    return MemoryPrediction(phases, allocated, reserved, gen, train, band, mem_total_gib, shape, coef, tuple(notes))
