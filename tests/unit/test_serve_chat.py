"""`POST /v1/chat/completions` in process (the app behind Starlette's test client), driven by
the official `openai` client unchanged: the messages through the tokeniser's chat template
(transformers' own `apply_chat_template`), the answer cut at the end of the turn, streamed
deltas that join to the unstreamed message, n, usage; and the 400s."""

import copy

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from starlette.testclient import TestClient  # noqa: E402

from mdlm_cli.serve.app import Settings, create_app  # noqa: E402
from mdlm_cli.serve.served import Served  # noqa: E402

from .test_serve_batching import TOK, served_model  # noqa: E402
from .test_serve_eos import EndsAt  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant {% endif %}")
MESSAGES = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
PROMPT = "system a user b assistant "  # what the template makes of MESSAGES


def templated(tokenizer):
    """The character tokeniser with a transformers tokeniser that holds a chat template (the
    characters are still encoded by the character tokeniser)."""
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    hf.chat_template = TEMPLATE
    out = copy.copy(tokenizer)
    out.hf = hf
    return out


def served_chat(template: bool = True, answer: int = 4) -> Served:
    """The test-size model, its tokeniser templated (or not), answering `answer` x's then EOS."""
    served = served_model("mdlm")
    if template:
        served.loaded.tokenizer = templated(TOK)
    served.denoiser = EndsAt(end=len(TOK.encode(PROMPT)) + answer)
    return served


@pytest.fixture
def client_for():
    opened = []

    def make(served: Served):
        http = TestClient(create_app(lambda: served, Settings(max_batch=2)))
        http.__enter__()
        opened.append(http)
        for _ in range(200):  # the model loads in a thread
            if http.get("/health").status_code == 200:
                break
        return openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http,
                             max_retries=0)

    yield make
    for http in opened:
        http.__exit__(None, None, None)


def test_a_chat_answer_ends_at_the_end_of_the_turn(client_for):
    client = client_for(served_chat(answer=4))
    out = client.chat.completions.create(model="test", messages=MESSAGES, seed=1, n=2)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    for choice in out.choices:
        assert choice.message.role == "assistant" and choice.message.content == "xxxx"
        assert choice.finish_reason == "stop"
    assert out.usage.prompt_tokens == 2 * len(PROMPT) and out.usage.completion_tokens == 8
    short = client.chat.completions.create(model="test", messages=MESSAGES, max_tokens=2)
    assert short.choices[0].message.content == "xx" and short.choices[0].finish_reason == "length"
    same = client.chat.completions.create(model="test", messages=MESSAGES,
                                          max_completion_tokens=2)
    assert same.choices[0].message.content == "xx"
    cut = client.chat.completions.create(model="test", messages=MESSAGES, stop=["xxx"])
    assert cut.choices[0].message.content == "" and cut.choices[0].finish_reason == "stop"


def test_streamed_deltas_join_to_the_message(client_for):
    client = client_for(served_chat(answer=3))
    chunks = list(client.chat.completions.create(model="test", messages=MESSAGES, seed=2,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == "xxx"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == 3


def test_what_chat_cannot_serve_is_a_400_naming_the_field(client_for):
    client = client_for(served_chat())
    for messages, words in (([], "non-empty list"),
                            ([{"role": "robot", "content": "hi"}], "role must be one of"),
                            ([{"role": "user"}], "role and content"),
                            ([{"role": "user", "content": [{"type": "image"}]}], "text parts")):
        with pytest.raises(openai.BadRequestError, match=words) as e:
            client.chat.completions.create(model="test", messages=messages)
        assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError, match="exceeds the window") as e:
        client.chat.completions.create(model="test", messages=MESSAGES, max_tokens=100)
    assert e.value.body["code"] == "context_length_exceeded"
    bare = client_for(served_chat(template=False))
    with pytest.raises(openai.BadRequestError, match="no chat template") as e:
        bare.chat.completions.create(model="test", messages=MESSAGES)
    assert e.value.body["code"] == "no_chat_template"


def test_the_template_is_transformers_own():
    rendered = templated(TOK).hf.apply_chat_template(MESSAGES, tokenize=False,
                                                     add_generation_prompt=True)
    assert rendered == PROMPT and torch.tensor(TOK.encode(rendered)).numel() == len(PROMPT)


def test_the_turn_ends_at_the_token_the_template_writes(tmp_path):
    """The end of a turn is read off the template (what it writes after an assistant's
    answer), as `mdlm sample --chat` reads it: a token no list of names knows works too."""
    from mdlm_cli.data.chat import end_of_turn_ids
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.generation.text import ChoiceText
    from tests.open_model_folders import write_tokenizer

    specials = ["<|bos|>", "<|eos|>", "<|turn_over|>", "<|mask|>"]  # ids 80..83
    template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }}<|turn_over|>"
                "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}")
    write_tokenizer(tmp_path, specials, {"bos_token": "<|bos|>", "eos_token": "<|eos|>",
                                         "mask_token": "<|mask|>", "chat_template": template,
                                         "tokenizer_class": "PreTrainedTokenizerFast"})
    tok = load_tokenizer(str(tmp_path))
    ends = end_of_turn_ids(tok)
    assert sorted(ends) == [81, 82]  # EOS and the template's end of turn
    text = ChoiceText(tok.decode, 10, [], None, end_ids=tuple(ends))
    text.feed(tok.encode("w1 w2") + [82] + tok.encode("w3"))
    assert text.finish() == "" and text.text == "w1 w2" and text.ended


def test_chat_logprobs_come_in_chats_shape(client_for):
    client = client_for(served_chat(answer=4))
    out = client.chat.completions.create(model="test", messages=MESSAGES, logprobs=True,
                                         top_logprobs=2)
    content = out.choices[0].logprobs.content
    assert "".join(t.token for t in content) == out.choices[0].message.content == "xxxx"
    for t in content:  # a certain model: log-probability 0, the others 0 probability (left out)
        assert abs(t.logprob) < 1e-6 and [a.token for a in t.top_logprobs] == ["x"]
        assert t.bytes == list(b"x")
    chunks = list(client.chat.completions.create(model="test", messages=MESSAGES, stream=True,
                                                 logprobs=True))
    last = [c for c in chunks if c.choices and c.choices[0].logprobs is not None]
    assert len(last) == 1 and len(last[0].choices[0].logprobs.content) == 4
    with pytest.raises(openai.BadRequestError, match="needs logprobs: true"):
        client.chat.completions.create(model="test", messages=MESSAGES, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="records") as e:
        client.chat.completions.create(model="test", messages=MESSAGES, logprobs=True,
                                       extra_body={"sampler": "confidence", "steps": 4})
    assert e.value.body["param"] == "logprobs"
