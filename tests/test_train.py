"""Adapter training: assistant-only SFT mask, SFT + LoRA, GRPO dropping constant groups, resume, bad input.

Runs the random-init tiny Llama of conftest.py (embedded model's tokenizer) and two small environments
defined here: a single-call weather lookup and a two-step order lookup (multi-turn).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from traceops.envs.base import AssistantTurn, Call, Environment
from traceops.errors import ConfigError, ModelError, TraceopsError
from traceops.model.chat_template import load_tokenizer
from traceops.train.budgets import BUDGETS, check_fits, get_budget
from traceops.train.config import AdapterSettings
from traceops.train.data import demonstration, load_environment_set

CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Turin", "Sofia", "Kyiv",
          "Riga"]
WEATHER = {city: ["sunny", "rainy", "cloudy", "windy"][i % 4] for i, city in enumerate(CITIES)}


class WeatherEnv(Environment):
    """Single tool call: the user asks for a city's weather; success is calling get_weather on that city."""

    capability = "tool_call_format"
    system_prompt = "You answer weather questions by calling the get_weather tool."

    def reset(self, **task: Any) -> str:
        self.city = task["city"]
        self.asked: list[str] = []
        return f"What is the weather in {self.city}?"

    def get_weather(self, city: str) -> str:
        """Current weather of a city.

        Args:
            city: Name of the city.
        """
        self.asked.append(city)
        if city not in WEATHER:
            raise KeyError(f"unknown city {city}")
        return WEATHER[city]

    def get_reward(self) -> float:
        return 1.0 if self.asked == [self.city] else 0.0

    def oracle(self) -> list[AssistantTurn]:
        return [AssistantTurn(calls=(Call("get_weather", {"city": self.city}),))]


class OrderEnv(Environment):
    """Two steps: find the user's id by name, then list that id's orders."""

    capability = "multi_step_transaction"
    system_prompt = "You look up customers' orders with the tools."

    def reset(self, **task: Any) -> str:
        self.name = task["name"]
        self.listed: list[int] = []
        return f"Which orders does {self.name} have?"

    def find_user(self, name: str) -> str:
        """Find a customer's id.

        Args:
            name: The customer's name.
        """
        return json.dumps({"user_id": 100 + CITIES.index(name)})

    def list_orders(self, user_id: int) -> str:
        """List a customer's orders.

        Args:
            user_id: The customer's id.
        """
        self.listed.append(user_id)
        return json.dumps([f"order-{user_id}-1"])

    def get_reward(self) -> float:
        return 1.0 if self.listed == [100 + CITIES.index(self.name)] else 0.0

    def oracle(self) -> list[AssistantTurn]:
        user_id = 100 + CITIES.index(self.name)
        return [AssistantTurn(calls=(Call("find_user", {"name": self.name}),)),
                AssistantTurn(calls=(Call("list_orders", {"user_id": user_id}),))]


def write_env_set(folder: Path, cls: type[Environment], key: str, train: int = 8) -> Path:
    """An environments folder: manifest + train/val/test JSONL splits."""
    (folder / "tasks").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"environment": f"{cls.__module__}:{cls.__name__}",
                                                      "capability": cls.capability}))
    splits = {"train": CITIES[:train], "val": CITIES[train:train + 2], "test": CITIES[train + 2:train + 4]}
    for split, values in splits.items():
        lines = [json.dumps({key: value}) for value in values]
        (folder / "tasks" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="session")
def tiny_base(tiny_model_dir: Path) -> Path:
    """The shared random-init tiny Llama with the embedded model's tokenizer (tests/conftest.py)."""
    import torch

    torch.set_num_threads(2)
    return tiny_model_dir


def test_assistant_only_mask_covers_exactly_the_assistant_turns(tiny_base: Path) -> None:
    from traceops.train.sft import assistant_mask

    tokenizer = load_tokenizer(str(tiny_base))
    env = OrderEnv()
    messages = demonstration(env, {"name": "Oslo"})
    ids, mask = assistant_mask(tokenizer, messages, env.tool_specs())
    masked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    expected = "".join(f"\n{m['content']}<|im_end|>\n" for m in messages if m["role"] == "assistant")
    assert masked == expected
    assert '<tool_call>{"name": "find_user", "arguments": {"name": "Oslo"}}</tool_call>' in masked
    unmasked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "Which orders does Oslo have?" in unmasked and "order-102-1" in unmasked and "<tools>" in unmasked
    assert "order-102-1" not in masked and "get the weather" not in masked


def test_replay_reward_and_trl_environment_score_parsed_calls() -> None:
    from traceops.model.toolcalls import render_tool_call
    from traceops.train.grpo import group_counts, skipped_update_count
    from traceops.train.rollouts import parse_turn, replay_reward, trl_environment

    reward = replay_reward(WeatherEnv)
    task = json.dumps({"city": "Oslo"})
    completions = [render_tool_call("get_weather", {"city": "Oslo"}),
                   render_tool_call("get_weather", {"city": "Lima"}), "It is sunny.",
                   'get_weather(city="Oslo")']
    assert reward(completions=completions, task_json=[task] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert parse_turn("Sure.\n" + completions[0]).calls == (Call("get_weather", {"city": "Oslo"}),)
    env = trl_environment(WeatherEnv)()
    assert type(env).__name__ == "WeatherEnv" and env.tool_names() == ["get_weather"]
    assert env.reset(prompt=[], task_json=task) == "What is the weather in Oslo?"
    env.get_weather("Oslo")
    assert env.get_reward() == 1.0
    history = [{"loss": 0.1},
               {"reward": 0.0, "dropped_constant_groups": 2.0, "groups": 2.0, "skipped_updates": 1.0},
               {"reward": 0.5, "dropped_constant_groups": 1.0, "groups": 2.0, "skipped_updates": 0.0},
               {"train_loss": 0.1}]
    assert group_counts(history) == (3, 4) and skipped_update_count(history) == 1


def test_bad_input_is_refused_before_training(tmp_path: Path, tiny_base: Path, home: Path) -> None:
    from traceops.train import train_adapter

    envs = write_env_set(tmp_path / "envs", WeatherEnv, "city")
    with pytest.raises(ConfigError, match="does not exist"):
        train_adapter("x", tmp_path / "missing", tiny_base, tmp_path / "out", budget="tiny")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="unknown base model"):
        train_adapter("x", envs, tmp_path / "empty", tmp_path / "out", budget="tiny")
    with pytest.raises(ConfigError, match="cannot target"):
        train_adapter("x", envs, tiny_base, tmp_path / "out", budget="tiny",
                      settings=AdapterSettings(target_modules=("c_attn", "q_proj")))
    with pytest.raises(ConfigError, match="CUDA GPU"):
        train_adapter("x", envs, tiny_base, tmp_path / "out", budget="full")
    with pytest.raises(ConfigError, match="unknown training budget"):
        get_budget("huge")
    with pytest.raises(ConfigError, match="GiB"):
        check_fits(BUDGETS["small"], 135_000_000, 4_880_000, 576, 30, 9, 49152, available=1 << 30)
    # FACTS.md calibration: 4 GB measured at batch 4 x 256 for the 135M model.
    calibration = replace(BUDGETS["small"], grpo_prompts_per_step=1, num_generations=4, sft_max_length=256,
                          sft_batch_size=4, gradient_checkpointing=False)
    need = check_fits(calibration, 134_515_008, 4_884_480, 576, 30, 9, 49152, available=1 << 40)
    assert 2.5e9 < need < 6e9
    assert not (tmp_path / "out" / "adapter").exists()
    assert all(issubclass(e, TraceopsError) for e in (ConfigError, ModelError))


@pytest.mark.slow
def test_sft_reduces_loss_and_adapter_loads_with_peft(tmp_path: Path, tiny_base: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from traceops.train.checkpoint import save_adapter
    from traceops.train.data import sft_rows
    from traceops.train.sft import build_sft_trainer, loss_curve

    env_set = load_environment_set(write_env_set(tmp_path / "envs", WeatherEnv, "city"))
    tokenizer = load_tokenizer(str(tiny_base))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    budget = replace(BUDGETS["tiny"], sft_steps=8, sft_batch_size=2, sft_lr=1e-2, save_steps=100)
    trainer = build_sft_trainer(model, tokenizer, sft_rows(env_set), budget, tmp_path / "ckpt", 0,
                                AdapterSettings())
    trainer.train()
    losses = loss_curve(trainer.state.log_history)
    assert len(losses) == 8
    # LoRA cannot move a random model's tied embeddings, so the drop is small but must be clear.
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05
    folder = save_adapter(trainer.model, tokenizer, tmp_path / "adapter")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32
    assert set(config["target_modules"]) == set(AdapterSettings().target_modules)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_base)), str(folder))
    assert sum(p.numel() for n, p in loaded.named_parameters() if "lora_" in n) > 0


def test_shared_prefix_loss_equals_trl_loss_and_gradients(tmp_path: Path, tiny_base: Path) -> None:
    """The batch's shared system + tools prefix run once gives TRL's loss and LoRA gradients."""
    import torch
    from transformers import AutoModelForCausalLM

    from traceops.train.data import sft_rows
    from traceops.train.prefix_loss import MIN_SHARED_TOKENS, shared_prefix_length
    from traceops.train.sft import build_sft_trainer

    env_set = load_environment_set(write_env_set(tmp_path / "envs", OrderEnv, "name"))
    tokenizer = load_tokenizer(str(tiny_base))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    budget = replace(BUDGETS["tiny"], sft_steps=1, sft_batch_size=4, save_steps=100)
    trainer = build_sft_trainer(model, tokenizer, sft_rows(env_set), budget, tmp_path / "ckpt", 0,
                                AdapterSettings())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B too, so A's gradients are not trivially zero
        for name, param in trainer.model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    lengths = batch["attention_mask"].sum(dim=1)
    assert int(lengths.min()) < int(lengths.max())  # right padding is exercised
    shared = shared_prefix_length(batch["input_ids"], batch["attention_mask"], batch["labels"])
    assert shared >= MIN_SHARED_TOKENS
    trainer.model.train()
    results = {}
    for share in (True, False):
        trainer.share_prefix = share
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        results[share] = (float(loss.detach()), grads)
    assert results[True][0] == pytest.approx(results[False][0], abs=1e-5)
    assert results[True][1].keys() == results[False][1].keys() and results[True][1]
    for name, grad in results[True][1].items():
        torch.testing.assert_close(grad, results[False][1][name], atol=1e-5, rtol=1e-4)
    assert trainer._metrics["train"]["shared_prefix_tokens"] == [float(shared)]


def test_shared_prefix_stops_before_the_first_supervised_token() -> None:
    import torch

    from traceops.train.prefix_loss import IGNORE, shared_prefix_length

    ids = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 7, 8, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    labels = torch.full_like(ids, IGNORE)
    assert shared_prefix_length(ids, mask, labels) == 4
    labels[0, 3] = 8  # token 3 carries loss: its logit comes from position 2, so at most 0..2 are shared
    assert shared_prefix_length(ids, mask, labels) == 2
    assert shared_prefix_length(ids[:1], mask[:1], labels[:1]) == 0  # one row: nothing to share
    assert shared_prefix_length(torch.tensor([[5, 6], [5, 6]]), torch.ones(2, 2, dtype=torch.long),
                                torch.full((2, 2), IGNORE)) == 1  # each row keeps a token of its own


@pytest.mark.slow
def test_grpo_drops_and_counts_constant_reward_groups(tmp_path: Path, tiny_base: Path) -> None:
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.train.grpo import _trainer_class, grpo_args

    tokenizer = load_tokenizer(str(tiny_base))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    model = get_peft_model(base, AdapterSettings().lora_config())
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Say {w}"}], tokenize=False,
                                             add_generation_prompt=True) for w in ("a", "b")]

    def reward(completions: list[str], prompts: list[str], **_: Any) -> list[float]:
        # Prompt "a" always scores 0 (a constant group); prompt "b" scores by completion length parity.
        pairs = zip(prompts, completions, strict=True)
        return [0.0 if "Say a" in p else float(sum(map(ord, c)) % 101) for p, c in pairs]

    budget = replace(BUDGETS["tiny"], grpo_steps=2, grpo_prompts_per_step=2, num_generations=4,
                     max_completion_length=12, save_steps=100)
    args = grpo_args(budget, tmp_path / "grpo", 0, multi_turn=False)
    trainer = _trainer_class()(model=model, reward_funcs=[reward], args=args, processing_class=tokenizer,
                               train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    seen: list[dict[str, Any]] = []
    original = trainer._generate_and_score_completions

    def spy(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = original(inputs)
        seen.append({"prompts": [x["prompt"] for x in inputs], "mask": out["tool_mask"].clone()})
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert trainer.total_groups == 4 and trainer.dropped_constant_groups == 2
    for batch in seen:
        for prompt, row in zip(batch["prompts"], batch["mask"], strict=True):
            assert bool(torch.all(row == 0)) == ("Say a" in prompt)
    logged = [e for e in trainer.state.log_history if "dropped_constant_groups" in e]
    assert [e["dropped_constant_groups"] for e in logged] == [1.0, 1.0]


@pytest.mark.slow
def test_grpo_skips_the_update_when_every_group_is_constant(tmp_path: Path, tiny_base: Path) -> None:
    import torch
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.train.grpo import _trainer_class, grpo_args

    tokenizer = load_tokenizer(str(tiny_base))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    model = get_peft_model(base, AdapterSettings().lora_config())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say a"}], tokenize=False,
                                           add_generation_prompt=True)
    budget = replace(BUDGETS["tiny"], grpo_steps=2, grpo_prompts_per_step=1, num_generations=2,
                     max_completion_length=8, save_steps=100, grpo_lr=1e-2)
    trainer = _trainer_class()(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                               args=grpo_args(budget, tmp_path / "grpo", 0, multi_turn=False),
                               processing_class=tokenizer,
                               train_dataset=Dataset.from_list([{"prompt": prompt}]))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    grad_forwards = []
    hook = model.register_forward_hook(lambda *_: grad_forwards.append(torch.is_grad_enabled()))
    trainer.train()
    hook.remove()
    assert trainer.dropped_constant_groups == trainer.total_groups == 2
    assert trainer.skipped_updates == 2
    assert not any(grad_forwards)  # generation ran (no grad), the loss forward never did
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if p.requires_grad)
    logged = [e["skipped_updates"] for e in trainer.state.log_history if "skipped_updates" in e]
    assert logged == [1.0, 1.0]


@pytest.mark.slow
def test_multi_turn_grpo_runs_through_trl_environment_factory(tmp_path: Path, tiny_base: Path) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.train.data import grpo_rows, is_multi_turn
    from traceops.train.grpo import build_grpo_trainer

    env_set = load_environment_set(write_env_set(tmp_path / "envs", OrderEnv, "name", train=4))
    assert is_multi_turn(env_set)
    tokenizer = load_tokenizer(str(tiny_base))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    model = get_peft_model(base, AdapterSettings().lora_config())
    budget = replace(BUDGETS["tiny"], grpo_steps=1, grpo_prompts_per_step=2, num_generations=2,
                     max_completion_length=16)
    rows = grpo_rows(env_set, tokenizer, multi_turn=True)
    trainer = build_grpo_trainer(model, tokenizer, env_set, rows, budget, tmp_path / "grpo", 0, True)
    assert sorted(trainer._env_tools[None][i].__name__ for i in range(2)) == ["find_user", "list_orders"]
    trainer.train()
    assert trainer.total_groups == 2 and "OrderEnv" in trainer.reward_func_names
    assert [e for e in trainer.state.log_history if "reward" in e][0]["reward"] == 0.0


def test_grpo_rollouts_from_the_prefix_cache_equal_trl_generation(tmp_path: Path, tiny_base: Path) -> None:
    """The trainer's rollouts come from a shared-prefix KV cache; greedy, they are TRL's own tokens, for a
    first turn (rows repeating one prompt) and a later round (rows with their own histories)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from traceops.train.data import grpo_rows
    from traceops.train.grpo import build_grpo_trainer

    env_set = load_environment_set(write_env_set(tmp_path / "envs", OrderEnv, "name", train=4))
    tokenizer = load_tokenizer(str(tiny_base))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_base))
    model = get_peft_model(base, AdapterSettings().lora_config())
    budget = replace(BUDGETS["tiny"], grpo_steps=1, grpo_prompts_per_step=2, num_generations=2,
                     max_completion_length=12)
    rows = grpo_rows(env_set, tokenizer, multi_turn=True)
    trainer = build_grpo_trainer(model, tokenizer, env_set, rows, budget, tmp_path / "grpo", 0, True)
    trainer.generation_config.do_sample = False
    prompts = [tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True,
                                             return_dict=False) for row in rows[:2]]
    first = [prompts[0], prompts[0], prompts[1], prompts[1]]
    later = [first[0] + [11, 22, 33], first[1] + [44], first[2] + [55, 66], first[3]]
    for batch in (first, later):
        ours, _ = trainer._generate_single_turn(batch, None, {}, 2)
        with torch.random.fork_rng(devices=[]):
            theirs, _ = GRPOTrainer._generate_single_turn(trainer, batch, None, {}, 2)
        assert ours == theirs and all(ours)
    assert trainer._rollout_chat is not None and trainer._rollout_chat._prefix is not None


class Interrupt(Exception):
    """Raised from the log callback to simulate a killed run."""


@pytest.mark.slow
def test_train_adapter_resumes_after_interruption(tmp_path: Path, tiny_base: Path, home: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from traceops.train import train_adapter

    envs = write_env_set(tmp_path / "envs", WeatherEnv, "city")
    budget = replace(BUDGETS["tiny"], sft_steps=4, save_steps=2, grpo_steps=1, eval_tasks=2, max_turns=1,
                     eval_max_new_tokens=12, max_completion_length=12)
    out = tmp_path / "out"

    def killer(phase: str, step: int, logs: dict[str, float]) -> None:
        if phase == "sft" and step == 3:
            raise Interrupt("killed after the step-2 checkpoint")

    with pytest.raises(Interrupt):
        train_adapter("tool_call_format", envs, tiny_base, out, budget=budget, seed=1, on_log=killer)
    assert (out / "checkpoints" / "sft" / "checkpoint-2").is_dir() and not (out / "adapter").exists()

    lines: list[tuple[str, int]] = []
    result = train_adapter("tool_call_format", envs, tiny_base, out, budget=budget, seed=1,
                           on_log=lambda phase, step, logs: lines.append((phase, step)))
    assert result.resumed_from == {"sft": 2, "grpo": None}
    assert [s for p, s in lines if p == "sft" and s <= 4][0] == 3
    assert len(result.sft_losses) == 4 and len(result.grpo_rewards) == 1
    groups = budget.grpo_steps * budget.grpo_prompts_per_step
    assert result.total_groups == groups and 0 <= result.dropped_constant_groups <= groups
    assert 0 <= result.skipped_updates <= budget.grpo_steps
    assert result.val_before["n"] == 2 and 0.0 <= result.val_after["success"] <= 1.0
    assert result.config["adapter"]["r"] == 16 and not result.config["multi_turn"]
    adapter = Path(result.adapter_path)
    assert (adapter / "adapter_model.safetensors").is_file()
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_base)), str(adapter))
    again = train_adapter("tool_call_format", envs, tiny_base, out, budget=budget, seed=1)
    assert again.sft_losses == result.sft_losses and "sft" not in again.timings


def test_synthesized_family_folder_loads_and_gives_canonical_sft_rows(tmp_path: Path) -> None:
    from traceops.envs.families import FAMILIES
    from traceops.envs.grounding import build_grounding
    from traceops.train.data import is_multi_turn, sft_rows

    family, grounding = FAMILIES["tool_call_format"], build_grounding([])
    folder = tmp_path / "tool_call_format"
    folder.mkdir()
    for split, n, offset in (("train", 3, 0), ("val", 2, 3), ("test", 2, 5)):
        tasks = family.generate(grounding, 0, n, offset=offset)
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "manifest.json").write_text(json.dumps({"capability": "tool_call_format"}))
    env_set = load_environment_set(folder)
    assert env_set.factory is family.env_class and len(env_set.tasks("val")) == 2
    assert is_multi_turn(env_set)  # a call turn, then a final text turn
    row = sft_rows(env_set)[0]
    roles = [m["role"] for m in row["messages"]]
    assert roles[:4] == ["system", "user", "assistant", "tool"] and roles[-1] == "assistant"
    assert row["messages"][2]["content"].startswith('<tool_call>{"name": "call_api"')
    assert json.loads(row["tools"])[0]["function"]["name"] == "call_api"


def test_save_adapter_replaces_the_folder_whole(tmp_path: Path, tiny_base: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.train.checkpoint import is_adapter, read_json, save_adapter, write_json

    tokenizer = load_tokenizer(str(tiny_base))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_base)),
                           LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "stale.txt").write_text("from an older run")
    assert save_adapter(model, tokenizer, folder) == folder
    assert is_adapter(folder) and not (folder / "stale.txt").exists()
    assert (folder / "tokenizer_config.json").is_file()
    write_json(tmp_path / "logs.json", {"step": 1})
    assert read_json(tmp_path / "logs.json") == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "logs.json"]


def test_multi_turn_rollout_limits_leave_room_for_the_oracle_episode(tmp_path: Path, tiny_base: Path) -> None:
    """TRL counts the completion limit over the whole episode: limits below the oracle's make reward 1.0
    unreachable (every group constant, no gradient): they are sized to the oracle, capped by the budget."""
    from traceops.train.grpo import multi_turn_budget

    env_set = load_environment_set(write_env_set(tmp_path / "envs", OrderEnv, "name", train=4))
    tokenizer = load_tokenizer(str(tiny_base))
    small = BUDGETS["small"]
    env, tools = OrderEnv(), OrderEnv().tool_specs()
    episodes = []
    for task in env_set.tasks("train"):
        messages = demonstration(env, task)
        prompt = tokenizer.apply_chat_template(messages[:2], tools=tools, tokenize=True, return_dict=True,
                                               add_generation_prompt=True)["input_ids"]
        full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                             return_dict=True)["input_ids"]
        episodes.append(len(full) - len(prompt))
    rollout = multi_turn_budget(env_set, tokenizer, small)
    assert rollout.max_turns == 2  # the oracle's two tool-calling turns
    assert rollout.grpo_steps == small.multi_turn_grpo_steps == 1  # episodes cost a step several rounds
    assert multi_turn_budget(env_set, tokenizer, replace(small, multi_turn_grpo_steps=None)).grpo_steps == \
        small.grpo_steps
    assert rollout.max_completion_length > max(episodes) > small.max_completion_length // 2
    assert multi_turn_budget(env_set, tokenizer, replace(small, max_turns=1)).max_turns == 1
    tight = replace(small, sft_max_length=len(prompt) + 40, max_completion_length=8)
    assert multi_turn_budget(env_set, tokenizer, tight).max_completion_length <= 40
