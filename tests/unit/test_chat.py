"""ChatFormat: incremental ids equal the template's own where the template is append-only, and
stay exactly what the model sampled where it is not."""

from __future__ import annotations

import pytest

from tests.unit.byte_chat import CHATML, byte_chat_tokenizer
from training.chat import ChatFormat
from training.inference.base import SamplingParams

pytestmark = pytest.mark.unit

SYSTEM = "You fix bugs. Reply with one ```bash block."
TASK = "<issue>\nordinalize(111) gives '111st'\n</issue>\n(Open file: n/a) (Current directory: /testbed)"
REPLIES = ["Let me look.\n```bash\ngrep -rn 'def ordinal' .\n```", "```bash\nsubmit\n```"]
OBSERVATION = "./inflection/__init__.py:209:def ordinal(number: int) -> str:\n(Current directory: /testbed)"


def _ids(tok, messages, gen=True):
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _incremental(chat: ChatFormat, replies_ids: list[list[int]], observations: list[str]) -> list[int]:
    """What the agent loop feeds the model: prompt, then per turn sampled ids + observation ids."""
    ids = chat.prompt_ids([{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}])
    for sampled, obs in zip(replies_ids, observations):
        ids += sampled + chat.observation_ids(obs, sampled)
    return ids


def _conversation(replies: list[str], observations: list[str]) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for r, o in zip(replies, observations):
        msgs += [{"role": "assistant", "content": r}, {"role": "user", "content": o}]
    return msgs


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    from swerl.model_cache import default_model_dir, is_cached

    if not is_cached(default_model_dir()):
        pytest.skip("the default model is not cached (swerl doctor / ensure_default_model fetches it)")
    return AutoTokenizer.from_pretrained(str(default_model_dir()))


@pytest.mark.parametrize("which", ["smollm2", "byte-chatml"])
def test_incremental_ids_equal_the_template(which, request):
    tok = request.getfixturevalue("smollm_tokenizer") if which == "smollm2" else byte_chat_tokenizer()
    chat = ChatFormat.from_tokenizer(tok)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert chat.eos_ids == [eos]
    assert chat.obs_prefix == "<|im_end|>\n<|im_start|>user\n"
    assert chat.obs_suffix == "<|im_end|>\n<|im_start|>assistant\n"
    # the model ended each turn itself (sampled <|im_end|>)
    sampled = [tok.encode(r, add_special_tokens=False) + [eos] for r in REPLIES]
    observations = [OBSERVATION, "Submitted."]
    assert _incremental(chat, sampled, observations) == _ids(tok, _conversation(REPLIES, observations))
    # the model ran out of tokens mid-turn: the wrapper closes the turn for it
    cut = [tok.encode(r, add_special_tokens=False) for r in REPLIES]
    obs_ids = chat.observation_ids(OBSERVATION, cut[0])
    assert obs_ids[0] == eos
    assert _incremental(chat, cut, observations) == _ids(tok, _conversation(REPLIES, observations))


def test_trimming_template_keeps_sampled_ids():
    """A template that strips whitespace rewrites history on re-render; we never re-render."""
    trim = CHATML.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    tok = byte_chat_tokenizer(trim)
    chat = ChatFormat.from_tokenizer(tok)
    assert chat.obs_prefix == "<|im_end|>\n<|im_start|>user\n"  # probes are not whitespace-padded
    eos = tok.eos_token_id
    replies = ["  \n```bash\nls\n```\n\n", "```bash\nsubmit\n```  "]
    sampled = [tok.encode(r, add_special_tokens=False) + [eos] for r in replies]
    observations = ["  a.py\n", "Submitted."]
    ids = _incremental(chat, sampled, observations)
    rendered = _ids(tok, _conversation(replies, observations))
    assert ids != rendered, "the template should have rewritten the whitespace (else this test tests nothing)"
    # the sampled ids are in the context exactly as sampled, at the place they were sampled
    prompt = chat.prompt_ids(_conversation([], []))
    assert ids[len(prompt):len(prompt) + len(sampled[0])] == sampled[0]
    obs0 = chat.observation_ids(observations[0], sampled[0])
    assert tok.decode(obs0) == "\n<|im_start|>user\n  a.py\n<|im_end|>\n<|im_start|>assistant\n"
    assert ids == prompt + sampled[0] + obs0 + sampled[1] + chat.observation_ids(observations[1], sampled[1])


def test_plain_text_template_without_end_of_turn_token():
    """A template whose turns are not closed by a special token: the wrapper is kept whole."""
    plain = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
             "{% if add_generation_prompt %}assistant: {% endif %}")
    tok = byte_chat_tokenizer(plain)
    chat = ChatFormat.from_tokenizer(tok)
    assert (chat.obs_prefix, chat.obs_suffix) == ("\nuser: ", "\nassistant: ")
    assert chat.eos_ids == [tok.eos_token_id]
    sampled = tok.encode("```bash\nls\n```", add_special_tokens=False) + [tok.eos_token_id]
    assert tok.decode(chat.observation_ids("a.py", sampled)) == "\nuser: a.py\nassistant: "


def test_template_that_drops_turns_is_refused():
    tok = byte_chat_tokenizer("{% for m in messages if m['role'] != 'assistant' %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ValueError, match="in order"):
        ChatFormat.from_tokenizer(tok)


def test_sampling_stops_at_end_of_turn():
    chat = ChatFormat.from_tokenizer(byte_chat_tokenizer())
    sp = chat.sampling(SamplingParams(stop_token_ids=(0,)))
    assert sp.stop_token_ids == (0, 2)
