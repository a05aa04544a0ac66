"""TRL's GRPOTrainer takes a family's environment unchanged through ``environment_factory``."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceops.envs import get_family
from traceops.envs.export import to_dataset
from traceops.envs.grounding import build_grounding


@pytest.mark.slow
def test_grpo_trainer_trains_one_step_on_a_family(tiny_model_dir: Path, tmp_path: Path, monkeypatch):
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    # SmolLM2's own template fails TRL's tool-calling check (FACTS.md); TRL ships a Qwen2.5 one that passes.
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    family = get_family("tool_call_format")
    tasks = family.generate(build_grounding([]), 0, 4)
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        max_steps=1,
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=16,
        report_to=[],
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        train_dataset=to_dataset(tasks, family),
        environment_factory=family.make_env,
    )
    assert [tool.__name__ for tool in trainer.tools] == ["call_api"]
    assert "ToolCallFormatEnv" in trainer.reward_func_names
    output = trainer.train()
    assert output.global_step == 1
    rewards = [entry for entry in trainer.state.log_history if "rewards/ToolCallFormatEnv/mean" in entry]
    assert rewards and 0.0 <= rewards[0]["rewards/ToolCallFormatEnv/mean"] <= 1.0
