"""Validation rules for multi-turn environments (``env.name`` naming one): what such a run supports."""

from __future__ import annotations

from sc_lightning.config.report import Report, ties
from sc_lightning.config.schema import SCConfig


@ties("env.max_conversation_tokens", "policy.max_total_sequence_length", "env.name")
def conversations_fit_the_rows(config: SCConfig, report: Report) -> None:
    """A whole conversation is one training row: env.max_conversation_tokens must fit the sequence length."""
    limit, context = config.env.max_conversation_tokens, config.policy.max_total_sequence_length
    if config.env.is_multiturn() and limit > context:
        report.error(
            "env.max_conversation_tokens",
            f"({limit}) exceeds policy.max_total_sequence_length ({context}); a conversation is one training row, "
            f"so set it to at most {context} (or raise policy.max_total_sequence_length)",
        )


@ties("env.name", "ppo.adv_estimator")
def multiturn_needs_grpo(config: SCConfig, report: Report) -> None:
    """PPO's GAE would run its recursion across the environment tokens' holes in the mask: not supported yet."""
    if config.env.is_multiturn() and config.is_ppo:
        report.error(
            "env.name",
            f"({config.env.name!r}) is a multi-turn environment, which trains with GRPO only (PPO's GAE over a "
            "conversation's masked environment tokens is not supported); use a grpo: block",
        )


@ties("env.name", "{algo}.val_period", "{algo}.val_at_start", "{algo}.val_at_end")
def multiturn_without_validation(config: SCConfig, report: Report) -> None:
    """Validation scores one completion per prompt; a multi-turn environment has no such score."""
    if config.env.is_multiturn() and config.has_one_algorithm and config.algo.validates():
        report.error(
            f"{config.algo_name}.val_period",
            f"validation scores single completions, which the multi-turn environment {config.env.name!r} cannot; "
            "set val_period: 0, val_at_start: false and val_at_end: false",
        )


@ties("env.name", "data.dataset_name", "data.apply_chat_template")
def multiturn_prompts_are_chat_rendered(config: SCConfig, report: Report) -> None:
    """A conversation opens with the prompt rendered as a user message by the chat template."""
    data = config.data
    if not config.env.is_multiturn() or data.dataset_name == "calculator":
        return
    if not data.builtin_dataset() and not data.apply_chat_template:
        report.error(
            "data.apply_chat_template",
            f"is false, but the multi-turn environment {config.env.name!r} opens each conversation with the prompt "
            "rendered by the tokenizer's chat template; set data.apply_chat_template: true",
        )
    elif data.dataset_name in ("arithmetic", "worked_arithmetic"):
        report.error(
            "data.dataset_name",
            f"({data.dataset_name}) holds raw prompts, but the multi-turn environment {config.env.name!r} needs "
            "prompts rendered by the chat template; use calculator, or a dataset file with data.apply_chat_template: "
            "true",
        )


@ties("data.apply_chat_template", "data.dataset_name")
def chat_template_applies_to_files(config: SCConfig, report: Report) -> None:
    """data.apply_chat_template renders a dataset file's prompts; the built-in datasets have their own rendering."""
    data = config.data
    if data.apply_chat_template and data.builtin_dataset():
        report.error(
            "data.apply_chat_template",
            f"is true, but data.dataset_name ({data.dataset_name}) is a built-in dataset, which renders its own "
            "prompts; set it false (it applies to dataset files)",
        )


@ties("data.messages_key", "env.name")
def chat_prompts_open_no_conversation(config: SCConfig, report: Report) -> None:
    """A multi-turn environment or an external agent starts from the prompt's text as one user message, so a
    prompt given as several chat messages (data.messages_key) would reach it cut to its last message."""
    data, env = config.data, config.env
    if data.messages_key is not None and (env.is_multiturn() or env.name == "external"):
        report.error(
            "data.messages_key",
            f"is {data.messages_key!r}, but env.name {env.name!r} opens each conversation with the prompt's text "
            "as one user message, so chat prompts are not supported there yet; set data.messages_key: null and "
            "give the prompt's text in data.prompt_key (with data.apply_chat_template: true)",
        )


@ties("data.system_prompt", "data.apply_chat_template", "data.messages_key", "env.name")
def system_prompt_opens_chat_rendered_text_prompts(config: SCConfig, report: Report) -> None:
    """data.system_prompt opens text prompts rendered by the chat template; elsewhere it is refused, never dropped."""
    data, env = config.data, config.env
    if data.system_prompt is None:
        return
    if data.messages_key is not None:
        why = f"data.messages_key is {data.messages_key!r}: chat prompts carry their own system message"
    elif not data.apply_chat_template:
        why = "data.apply_chat_template is false: prompts are the raw text, with no chat template to render it"
    elif env.is_multiturn() or env.name == "external":
        why = f"env.name {env.name!r} opens each conversation with the prompt's text alone (not supported there yet)"
    else:
        return
    report.error("data.system_prompt", f"is set, but {why}; set data.system_prompt: null")


MULTITURN_RULES = (
    system_prompt_opens_chat_rendered_text_prompts,
    multiturn_prompts_are_chat_rendered,
    chat_template_applies_to_files,
    chat_prompts_open_no_conversation,
    conversations_fit_the_rows,
    multiturn_needs_grpo,
    multiturn_without_validation,
)
