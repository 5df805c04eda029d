"""The page at / in chat mode, in a headless chromium, against `mdlm serve` on a tiny random
LLaDA folder (its tokeniser has a chat template): three turns sent, each answer streamed into
the conversation, and the model card says chat is there."""

from ..open_model_folders import write_llada
from .test_serve import (
    chromium_api,
    chromium_page,
    free_port,
    request,
    start_server,
    stop_server,
    wait_healthy,
)


def test_the_page_chats_with_a_model_that_has_a_chat_template(tmp_path):
    chromium_api()  # skip before starting a server where there is no browser
    folder = write_llada(tmp_path / "llada")
    port, log = free_port(), tmp_path / "server.log"
    proc = start_server(folder, port, "--max-batch", "2", log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        status, models = request(f"{url}/v1/models", key=None)
        assert status == 200 and models["data"][0]["mdlm"]["chat"] is True
        with chromium_page(url) as page:
            page.wait_for_function("!document.getElementById('chatbox').hidden")
            page.check("#chat")
            page.dispatch_event("#chat", "change")
            page.select_option("#sampler", "first-hitting")
            # three turns: the third mostly outgrows the window with the page's quarter-window
            # max_tokens, and the page asks again for the room left
            for question in ("hello there", "and again", "once more"):
                page.fill("#prompt", question)
                page.click("#go")
                page.wait_for_function(
                    "document.getElementById('status').dataset.done === '1'")
                page.evaluate("delete document.getElementById('status').dataset.done")
            turns = page.eval_on_selector_all(
                "#chatlog .turn", "els => els.map(e => [e.className, e.textContent])")
            status_text = page.inner_text("#status")
    finally:
        stop_server(proc)
    assert [c for c, _ in turns] == ["turn user", "turn assistant"] * 3
    assert [turns[i][1] for i in (0, 2, 4)] == ["hello there", "and again", "once more"]
    assert "answered in" in status_text, status_text
