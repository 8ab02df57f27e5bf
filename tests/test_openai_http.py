"""The OpenAI-compatible HTTP front (bass/app/http/) driven by the official `openai` client, over
the real services on real ports: the same text as the gRPC API, streaming, errors, cancellation."""

import json
import threading
import time

import httpx2 as httpx  # what the openai client is built on
import openai
import pytest

from bass.app.client import BassClient
from bass.app.http.server import serve_http
from bass.core.config import HttpConfig
from services import run_at_once, start_services
from test_services import wait_until

PROMPT = "def fibonacci(n):"
# The tiny models' tokenizer has no chat template: the front is given this one.
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
NO_EOS = {"extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def services(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def front(services, llama_target, tmp_path_factory):
    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    http = serve_http(HttpConfig(port=0, coordinator_address=services.address, tokenizer_dir=llama_target,
                                 chat_template=template, model_name="tiny"))
    yield http
    http.stop(grace_s=1)


@pytest.fixture
def client(front):
    with openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture
def grpc_client(services):
    with BassClient(services.address, timeout_s=60) as c:
        yield c


def test_models_and_health(client, front):
    assert [m.id for m in client.models.list()] == ["tiny"]
    r = httpx.get(f"http://{front.address}/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_greedy_completion_equals_grpc(client, grpc_client):
    want = grpc_client.generate(PROMPT, max_new_tokens=20, temperature=0, ignore_eos=True).sequences[0]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0, **NO_EOS)
    assert r.object == "text_completion" and r.model == "tiny" and len(r.choices) == 1
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 20 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20


def test_token_id_prompt_equals_grpc(client, grpc_client):
    ids = [5, 17, 33, 200, 7]
    want = grpc_client.generate(ids, max_new_tokens=12, ignore_eos=True).sequences[0]
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=12, temperature=0, **NO_EOS)
    assert r.choices[0].text == want.text and r.usage.prompt_tokens == 5


def test_seeded_sampling_with_n_equals_grpc(client, grpc_client):
    options = dict(n=3, max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=7, ignore_eos=True)
    want = grpc_client.generate(PROMPT, **options).sequences
    r = client.completions.create(model="tiny", prompt=PROMPT, n=3, max_tokens=16, temperature=0.9, top_p=0.95,
                                  seed=7, extra_body={"ignore_eos": True, "top_k": 50})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [s.text for s in want]
    assert len({c.text for c in r.choices}) > 1  # n sequences differ
    assert r.usage.completion_tokens == 48


def test_stop_string_cuts_the_text(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0, **NO_EOS)
    text = full.choices[0].text
    stop = text[3:6]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop],
                                    **NO_EOS)
    assert cut.choices[0].text == text[:text.find(stop)] and cut.choices[0].finish_reason == "stop"


def test_streamed_completion_adds_up_with_usage_last(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, n=2, max_tokens=20, temperature=0.8, seed=3,
                                     **NO_EOS)
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, n=2, max_tokens=20, temperature=0.8,
                                            seed=3, stream=True, stream_options={"include_usage": True}, **NO_EOS))
    texts, reasons = {}, {}
    for c in chunks[:-1]:
        assert c.usage is None and len(c.choices) == 1
        texts[c.choices[0].index] = texts.get(c.choices[0].index, "") + c.choices[0].text
        if c.choices[0].finish_reason:
            reasons[c.choices[0].index] = c.choices[0].finish_reason
    assert len(chunks) > 3
    assert texts == {c.index: c.text for c in full.choices} and reasons == {0: "length", 1: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40


def test_chat_renders_the_template_and_equals_grpc(client, grpc_client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    rendered = "<system>Be brief.\n<user>Say hello.\n<assistant>"
    want = grpc_client.generate(rendered, max_new_tokens=16, ignore_eos=True).sequences[0]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0, **NO_EOS)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text and r.choices[0].finish_reason == "length"
    # max_completion_tokens (newer clients) means the same
    r2 = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=16, temperature=0,
                                        **NO_EOS)
    assert r2.choices[0].message.content == want.text


def test_streamed_chat_adds_up(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Count."}]}]
    full = client.chat.completions.create(model="tiny", messages=messages, n=2, max_tokens=12, temperature=0,
                                          **NO_EOS)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, n=2, max_tokens=12,
                                                 temperature=0, stream=True, **NO_EOS))
    roles, texts, reasons = {}, {}, {}
    for c in chunks:
        assert c.object == "chat.completion.chunk"
        choice = c.choices[0]
        if choice.delta.role:
            roles[choice.index] = choice.delta.role
        texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        if choice.finish_reason:
            reasons[choice.index] = choice.finish_reason
    assert roles == {0: "assistant", 1: "assistant"} and reasons == {0: "length", 1: "length"}
    assert texts == {c.index: c.message.content for c in full.choices}


def test_speculation_off_and_time_budget_extensions(client, grpc_client):
    want = grpc_client.generate(PROMPT, max_new_tokens=10, ignore_eos=True, speculate=False)
    assert want.stats.draft_tokens == 0
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0,
                                  extra_body={"ignore_eos": True, "bass": {"speculate": False}})
    assert r.choices[0].text == want.sequences[0].text
    assert r.model_extra["bass"]["draft_tokens"] == 0
    budget = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=400, temperature=0,
                                       extra_body={"ignore_eos": True, "bass": {"time_budget_ms": 1}})
    assert budget.choices[0].finish_reason in ("time_budget", "length")


@pytest.mark.parametrize("body,param", [
    (dict(prompt=PROMPT, max_tokens=100000), "max_tokens"),
    (dict(prompt=PROMPT, max_tokens=0), "max_tokens"),
    (dict(prompt=PROMPT, n=100), "n"),
    (dict(prompt=PROMPT, temperature=-1), "temperature"),
    (dict(prompt=PROMPT, top_p=0), "top_p"),
    (dict(prompt=PROMPT, top_p="high"), "top_p"),
    (dict(prompt=PROMPT, seed=-1), "seed"),
    (dict(prompt=PROMPT, stop=[""]), "stop"),
    (dict(prompt=PROMPT, stop=5), "stop"),
    (dict(prompt=PROMPT, logprobs=2), "logprobs"),
    (dict(prompt=PROMPT, echo=True), "echo"),
    (dict(prompt=PROMPT, presence_penalty=0.5), "presence_penalty"),
    (dict(prompt=""), "prompt"),
    (dict(prompt=[5, 999999]), "prompt"),
    (dict(prompt=[5, -1]), "prompt"),
    (dict(prompt=["a", "b"]), "prompt"),
    (dict(), "prompt"),
    (dict(prompt=PROMPT, n=2 ** 40), "n"),
    (dict(prompt=PROMPT, bass={"time_budget_ms": -5}), "bass.time_budget_ms"),
    (dict(prompt=PROMPT, bass={"draft_length": 3}), "bass.draft_length"),
])
def test_bad_completion_requests_are_400_naming_the_field(front, body, param):
    r = httpx.post(f"{front.url}/completions", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param) and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,param", [
    (dict(messages=[]), "messages"),
    (dict(messages=[{"content": "no role"}]), "messages"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), "messages"),
    (dict(messages=[{"role": "user", "content": "hi"}], logprobs=True), "logprobs"),
    (dict(messages=[{"role": "user", "content": "hi"}], tools=[{"type": "function"}]), "tools"),
    (dict(messages=[{"role": "user", "content": "hi"}], max_completion_tokens=100000), "max_completion_tokens"),
])
def test_bad_chat_requests_are_400_naming_the_field(front, body, param):
    r = httpx.post(f"{front.url}/chat/completions", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_bodies_are_400_never_500(front):
    for content in (b"{not json", b"[1, 2]", b"\xff\xfe", b"null"):
        r = httpx.post(f"{front.url}/completions", content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (content, r.text)
        assert r.json()["error"]["param"] == "body"
    r = httpx.post(f"{front.url}/completions", content=b"x" * (5 * 1024 * 1024))
    assert r.status_code == 413
    assert httpx.get(f"{front.url}/nothing").status_code == 404
    assert httpx.get(f"{front.url}/completions").status_code == 405


def test_the_openai_client_raises_bad_request_with_the_param(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=100000)
    assert info.value.status_code == 400 and info.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=100000, stream=True)


def test_a_missing_chat_template_is_a_clear_400(services, llama_target):
    http = serve_http(HttpConfig(port=0, coordinator_address=services.address, tokenizer_dir=llama_target))
    try:
        r = httpx.post(f"{http.url}/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                       "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert "chat template" in r.json()["error"]["message"]
    finally:
        http.stop(grace_s=0)


def running(services):
    return len(services.target.engine.runner.sequences), len(services.draft.engine.runner.sequences)


def metric(services, name, **labels):
    return services.coordinator.engine.metrics.registry.get_sample_value(name, labels) or 0


def cancelled(services):
    return metric(services, "bass_requests_total", outcome="cancelled")


def test_a_client_dropping_mid_stream_frees_its_slots(front, services):
    body = {"model": "tiny", "prompt": PROMPT, "n": 4, "max_tokens": 500, "stream": True, "ignore_eos": True}
    before = cancelled(services)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{front.url}/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["object"] == "text_completion"
            assert wait_until(lambda: running(services)[0] == 4)
    assert wait_until(lambda: running(services) == (0, 0))
    assert cancelled(services) == before + 1  # cut short, not finished
    assert wait_until(lambda: metric(services, "bass_running_sequences") == 0)


def test_a_client_dropping_a_plain_request_frees_its_slots(front, services):
    # Long enough that the client gives up while it runs, whatever the machine's speed (8 x 500
    # tokens is over a second of steps for the tiny model even alone; 3 x 500 once was not).
    body = {"model": "tiny", "prompt": PROMPT, "n": 8, "max_tokens": 500, "ignore_eos": True}
    before = cancelled(services)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{front.url}/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    assert wait_until(lambda: running(services) == (0, 0))
    assert cancelled(services) == before + 1
    assert wait_until(lambda: metric(services, "bass_running_sequences") == 0)


def test_a_full_queue_is_429_and_a_down_coordinator_503(llama_target, llama_draft):
    s = start_services(llama_target, llama_draft, policy="3", max_batch_size=1, num_slots=1, max_waiting=1)
    http = serve_http(HttpConfig(port=0, coordinator_address=s.address, tokenizer_dir=llama_target))
    statuses, lock = [], threading.Lock()

    def call(_):
        r = httpx.post(f"{http.url}/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 40,
                                                        "temperature": 0, "ignore_eos": True}, timeout=120)
        with lock:
            statuses.append((r.status_code, r.json()))

    try:
        run_at_once(call, 10)
        assert len(statuses) == 10
        codes = [code for code, _ in statuses]
        assert set(codes) == {200, 429}, codes
        refused = next(body for code, body in statuses if code == 429)
        assert "queue is full" in refused["error"]["message"] and refused["error"]["type"] == "rate_limit_error"
        with openai.OpenAI(base_url=http.url, api_key="x", max_retries=0) as client:
            s.coordinator.stop(grace_s=0)
            with pytest.raises(openai.APIStatusError) as info:
                client.completions.create(model="m", prompt=PROMPT, max_tokens=4)
            assert info.value.status_code == 503
            assert httpx.get(f"http://{http.address}/health").status_code == 503
    finally:
        http.stop(grace_s=0)
        s.stop()


def stream_until(url: str, started, kill) -> list[str]:
    """Stream a long n = 2 completion; once its first chunk has come and started() holds, kill()
    the target. Returns the events after the first, checked: the chunks so far (none claiming
    its sequence finished), then one error event with 503's type and code, then `[DONE]`, all
    promptly: the client's read timeout turns a hang into a failure."""
    body = {"model": "m", "prompt": PROMPT, "n": 2, "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=httpx.Timeout(60, read=15)) as c, \
            c.stream("POST", f"{url}/completions", json=body) as r:
        assert r.status_code == 200
        events = (line[6:] for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(next(events))["object"] == "text_completion"
        assert wait_until(started)
        t0 = time.monotonic()
        kill()
        rest = list(events)
        assert time.monotonic() - t0 < 10
    assert rest[-1] == "[DONE]"
    error = json.loads(rest[-2])["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "unavailable", error
    chunks = [json.loads(e) for e in rest[:-2]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert not any(c["choices"][0]["finish_reason"] for c in chunks)  # no sequence claims to have finished
    return rest


def test_the_target_dying_mid_stream_ends_the_stream_with_an_error_event_then_503(llama_target, llama_draft):
    """The target dies while a stream runs. The 200 and the first chunks are already sent, so the
    error comes as one SSE event `data: {"error": ...}` (503's type and code) and the stream ends
    with `[DONE]`: promptly, never a hang, and the openai client raises APIError with that body.
    The coordinator's slots are freed. While the target is down a new request is 503, streamed
    or not; once it is back, 200 again."""
    s = start_services(llama_target, llama_draft, policy="3")
    http = serve_http(HttpConfig(port=0, coordinator_address=s.address, tokenizer_dir=llama_target))
    before = metric(s, "bass_requests_total", outcome="unavailable")
    try:
        stream_until(http.url, lambda: running(s)[0] == 2, lambda: s.target.stop(grace_s=0))
        # (counted just after the answer is handed over: wait for it)
        assert wait_until(lambda: metric(s, "bass_requests_total", outcome="unavailable") == before + 1)
        assert wait_until(lambda: metric(s, "bass_running_sequences") == 0)

        with openai.OpenAI(base_url=http.url, api_key="x", max_retries=0, timeout=30) as client:
            for stream in (False, True):  # the target is still down: refused before any chunk
                with pytest.raises(openai.APIStatusError) as info:
                    client.completions.create(model="m", prompt=PROMPT, max_tokens=4, stream=stream)
                assert info.value.status_code == 503 and info.value.body["type"] == "service_unavailable"
            s.restart_target()
            # The openai client's own view of a mid-stream error: APIError with our body.
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=4, temperature=0)
                    break
                except openai.APIStatusError as e:  # until the coordinator has reconnected
                    assert e.status_code == 503 and time.monotonic() < deadline
                    time.sleep(0.2)
            assert r.usage.completion_tokens == 4
            # The draft (never down) drops the failed stream's 2 sequences: it learns of them with
            # its next call. What it holds then is at most the one just answered (freed lazily).
            assert wait_until(lambda: client.completions.create(model="m", prompt=PROMPT, max_tokens=4)
                              and running(s)[1] <= 1)
            stream = client.completions.create(model="m", prompt=PROMPT, max_tokens=500, stream=True, **NO_EOS)
            next(iter(stream))
            s.target.stop(grace_s=0)
            with pytest.raises(openai.APIError) as info:
                list(stream)
            assert info.value.body["type"] == "service_unavailable"
        assert wait_until(lambda: metric(s, "bass_running_sequences") == 0)
    finally:
        http.stop(grace_s=0)
        s.stop()


def test_the_target_process_killed_mid_stream_is_the_same_clean_error(llama_target, tmp_path):
    """As above with the target a real process, SIGKILLed (no goodbye on its connections; regular
    decoding keeps a call in flight): the same error event promptly, the slots freed, then 503."""
    import signal
    import subprocess

    from bass.coordinator import server as coordinator_server
    from bass.core.config import CoordinatorConfig
    from test_serve_cli import bass_cmd

    target = subprocess.Popen(bass_cmd("target-service", "--model", llama_target, "--device", "cpu", "--port", 0,
                                       "--num-slots", 4, "--max-seq-len", 1024), stdout=subprocess.PIPE, text=True)
    coordinator = http = None
    try:
        address = json.loads(target.stdout.readline())["address"]
        coordinator = coordinator_server.serve(CoordinatorConfig(target_address=address, tokenizer_dir=llama_target,
                                                                 port=0, reconnect_interval_s=0.2))
        http = serve_http(HttpConfig(port=0, coordinator_address=coordinator.address, tokenizer_dir=llama_target))
        gauge = coordinator.engine.metrics.registry.get_sample_value
        stream_until(http.url, lambda: gauge("bass_running_sequences") == 2,
                     lambda: target.send_signal(signal.SIGKILL))
        assert wait_until(lambda: gauge("bass_running_sequences") == 0)
        r = httpx.post(f"{http.url}/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 4}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        target.kill()
        target.wait()
        if http is not None:
            http.stop(grace_s=0)
        if coordinator is not None:
            coordinator.stop(grace_s=0)


def test_bass_serve_with_an_http_port_serves_openai_clients(llama_target, llama_draft, tmp_path):
    """`bass serve --http-port 0` with an [http] section: real processes, the front's ready line,
    completions and chat through the openai client, and SIGTERM stops every process."""
    import os
    import signal
    import subprocess

    from test_serve_cli import bass_cmd, children_of

    template = tmp_path / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    config = tmp_path / "bass.toml"
    config.write_text(f'[coordinator]\nport = 0\n[target]\nnum_slots = 4\nmax_seq_len = 256\n[draft]\nnum_slots = 4\n'
                      f'max_seq_len = 256\n[http]\nmodel_name = "tiny"\nchat_template = "{template}"\n')
    proc = subprocess.Popen(bass_cmd("serve", "--target", llama_target, "--draft", llama_draft, "--device", "cpu",
                                     "--config", config, "--http-port", 0),
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ready, deadline = {}, time.monotonic() + 180
        while "http" not in ready:
            assert time.monotonic() < deadline, "services did not start"
            line = proc.stdout.readline()
            assert line, f"bass serve exited early with {proc.poll()}"
            try:
                ready[json.loads(line)["service"]] = json.loads(line)
            except (ValueError, KeyError):
                continue
        children = children_of(proc.pid)
        assert len(children) == 3  # the model services, the coordinator, the front
        url = ready["http"]["url"]
        assert url == f"http://{ready['http']['address']}/v1"
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as client, \
                BassClient(ready["coordinator"]["address"], timeout_s=60) as grpc_client:
            assert [m.id for m in client.models.list()] == ["tiny"]
            want = grpc_client.generate(PROMPT, max_new_tokens=12, ignore_eos=True).sequences[0].text
            r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0, **NO_EOS)
            assert r.choices[0].text == want
            chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=5, temperature=0, **NO_EOS)
            assert chat.usage.completion_tokens == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    time.sleep(0.5)
    assert all(not os.path.exists(f"/proc/{pid}") for pid in children), "a service outlived bass serve"


def test_the_http_section_and_flag_reach_the_config(llama_target, tmp_path):
    from bass.app.cli.serve import serve, serve_config
    from bass.core.config import load_config_file
    from bass.core.errors import InvalidRequestError

    base = ["--target", str(llama_target), "--draft", "none", "--device", "cpu"]
    assert serve_config(serve.make_context("serve", base)).http.port is None  # off by default
    assert serve_config(serve.make_context("serve", [*base, "--http-port", "8001"])).http.port == 8001
    config = tmp_path / "bass.toml"
    config.write_text('[http]\nport = 8002\nhost = "0.0.0.0"\nmodel_name = "m"\n')
    cfg = serve_config(serve.make_context("serve", [*base, "--config", str(config)]))
    assert (cfg.http.port, cfg.http.host, cfg.http.served_model_name) == (8002, "0.0.0.0", "m")
    config.write_text('[http]\nprot = 8002\n')
    with pytest.raises(InvalidRequestError, match="http.prot"):
        load_config_file(config)


def test_bass_up_takes_the_http_port_flag_and_hands_the_front_to_the_launcher(llama_target, llama_draft, tmp_path,
                                                                               monkeypatch):
    """`bass up --http-port` (over [http] in the file) reaches the launcher with the front's
    server, and the printed lines give the front's url; Ray itself is replaced (test_ray_deploy.py
    runs the launcher on a real cluster)."""
    pytest.importorskip("ray")
    from click.testing import CliRunner

    from bass.app.http.server import serve_http as the_front
    from bass.cli import main
    from bass.deploy import launcher

    seen = {}

    def up(cfg, echo, serve_http=None):
        seen.update(cfg=cfg, serve_http=serve_http)
        return {"colocated": "127.0.0.1:1", "coordinator": "127.0.0.1:2", "http": f"127.0.0.1:{cfg.http.port}"}

    monkeypatch.setattr(launcher, "connect", lambda *_: None)
    monkeypatch.setattr(launcher, "up", up)
    config = tmp_path / "bass.toml"
    config.write_text('[target]\ndevice = "cpu"\n[http]\nport = 8001\nmodel_name = "m"\n')
    result = CliRunner().invoke(main, ["up", "--ray-address", "127.0.0.1:1", "--config", str(config), "--target",
                                       str(llama_target), "--draft", str(llama_draft), "--http-port", "8002"])
    assert result.exit_code == 0, result.output
    assert seen["serve_http"] is the_front
    assert (seen["cfg"].http.port, seen["cfg"].http.model_name) == (8002, "m")
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert {"service": "http", "address": "127.0.0.1:8002", "url": "http://127.0.0.1:8002/v1"} in lines


def test_continuous_usage_counts_the_tokens_of_every_chunk(front):
    body = {"model": "tiny", "prompt": PROMPT, "n": 2, "max_tokens": 15, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", f"{front.url}/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 30 and chunks[-1]["choices"] == []
