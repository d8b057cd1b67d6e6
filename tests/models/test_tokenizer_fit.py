"""A tokenizer that can produce ids past the model's vocabulary is refused before the model is built or used.

Real tokenizers and models throughout: the built-in tiny model (vocabulary 18), tiny HF model directories from
examples/make_tiny_model.py, and a transformers tokenizer with added tokens (the "added a [PAD] token but never
resized the embeddings" case).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_lightning.models.megatron import load_policy
from sc_lightning.models.tiny_tokenizer import save_char_tokenizer
from sc_lightning.tokenizer import CharTokenizer, TokenizerMismatchError, check_tokenizer_fits_model, load_tokenizer
from tests.helpers.models import make_tiny_model

pytestmark = pytest.mark.usefixtures("model_parallel")


@pytest.fixture(scope="module")
def padded_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers tokenizer: CharTokenizer's 18 ids plus a new pad token (id 18) and two added tokens (19, 20)."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("padded_tokenizer")
    save_char_tokenizer(path)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.add_special_tokens({"pad_token": "<pad2>"})
    tok.add_tokens(["<x1>", "<x2>"])
    tok.save_pretrained(str(path))
    return path


def test_a_tokenizer_within_the_vocabulary_fits_and_a_padded_table_is_fine() -> None:
    """Equal sizes fit, and so does a model with more rows than the tokenizer has ids; one row fewer does not."""
    check_tokenizer_fits_model(CharTokenizer(), 18, model_name="builtin:tiny")
    check_tokenizer_fits_model(CharTokenizer(), 64, model_name="builtin:tiny")
    with pytest.raises(TokenizerMismatchError, match=r"it can produce ids 17\.\.17"):
        check_tokenizer_fits_model(CharTokenizer(), 17, model_name="builtin:tiny")


def test_tokenizer_name_with_more_ids_than_the_builtin_model_fails_naming_both(padded_tokenizer_dir: Path) -> None:
    """policy.tokenizer_name with 21 ids (pad 18) against builtin:tiny's 18 rows: both sizes, both knobs, the fix."""
    assert load_tokenizer(str(padded_tokenizer_dir)).vocab_size == 21
    with pytest.raises(TokenizerMismatchError) as raised:
        load_policy("builtin:tiny", tokenizer_name=str(padded_tokenizer_dir))
    message = str(raised.value)
    assert f"policy.tokenizer_name='{padded_tokenizer_dir}' has a vocabulary of 21 ids" in message
    assert "policy.model_name='builtin:tiny' has 18 embedding rows" in message
    assert "it can produce ids 18..20 and its pad id is 18" in message
    assert "Fix: use the tokenizer made for this model" in message
    assert "a model with at least 21 vocabulary rows" in message


def test_a_model_directory_whose_vocabulary_is_smaller_than_its_own_tokenizer_fails(tmp_path: Path) -> None:
    """An HF directory with 12 embedding rows and the 18-id char tokenizer: refused, naming the unset tokenizer_name."""
    small = make_tiny_model(tmp_path / "small-vocab", vocab_size=12)
    with pytest.raises(TokenizerMismatchError) as raised:
        load_policy(str(small))
    message = str(raised.value)
    assert "the tokenizer of policy.model_name (policy.tokenizer_name is unset) has a vocabulary of 18 ids" in message
    assert f"policy.model_name='{small}' has 12 embedding rows; it can produce ids 12..17" in message
    _, spec, tokenizer = load_policy(str(small), tokenizer_name=None, check_tokenizer=False)
    assert (spec.vocab_size, tokenizer.vocab_size) == (12, 18)  # the check, not the loading, refused it


def test_a_ppo_critic_that_cannot_embed_the_policy_tokens_fails(tmp_path: Path) -> None:
    """The critic reads the policy's token ids: a 12-row critic under the 18-id policy tokenizer is refused."""
    from sc_lightning.lightning.ppo_module import PPOModule
    from tests.helpers.fits import ppo_config

    small = make_tiny_model(tmp_path / "small-critic", vocab_size=12)
    module = PPOModule(ppo_config("policy.model_name=builtin:tiny", f"value.model_name={small}"))
    with pytest.raises(TokenizerMismatchError, match=rf"value\.model_name='{small}' has 12 embedding rows"):
        module.configure_model()
    assert module.policy is not None and module.critic is None
    fitting = PPOModule(ppo_config("policy.model_name=builtin:tiny", "value.model_name=builtin:tiny"))
    fitting.configure_model()
    assert fitting.critic is not None
