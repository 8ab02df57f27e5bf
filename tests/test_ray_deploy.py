"""`bass up` on a real local Ray cluster (CPU, with logical GPUs so placement can be checked)."""

import time

import pytest

ray = pytest.importorskip("ray")

from bass.app.client import BassClient  # noqa: E402
from bass.coordinator.requests import GenerationRequest  # noqa: E402
from bass.core.config import (CoordinatorConfig, DraftLengthConfig, DraftStreamConfig, HttpConfig, RayConfig,  # noqa: E402
                              SchedulerConfig, ServeConfig, WorkerServiceConfig)
from conftest import build_scheduler  # noqa: E402
from ports import bindable, fixed_port  # noqa: E402

NAMESPACE = "bass-test"
PROMPT = [5, 17, 33, 200]


@pytest.fixture(scope="module")
def cluster():
    for attempt in (1, 2):
        try:
            # "local": a cluster of its own, never a Ray the machine already runs (a user's).
            ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=False, namespace=NAMESPACE,
                     log_to_driver=False)
            break
        except Exception as exc:  # Ray allows its raylet 30 s to register, which a busy 2-core box can miss
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def expected(llama_target):
    (r,) = build_scheduler(llama_target, None).generate(
        [GenerationRequest(prompt_ids=tuple(PROMPT), max_new_tokens=20, ignore_eos=True)])
    return r.sequences[0].token_ids


def config(target, draft, *, target_gpus, draft_gpus, strategy="PACK", colocate=False, stream=0,
           http=HttpConfig()) -> ServeConfig:
    workers = dict(device="cpu", num_slots=8, max_seq_len=256, host="127.0.0.1")
    return ServeConfig(
        target=WorkerServiceConfig(model_dir=target, **workers), draft=WorkerServiceConfig(model_dir=draft, **workers),
        coordinator=CoordinatorConfig(host="127.0.0.1", port=fixed_port(), reconnect_interval_s=0.2,
                                      scheduler=SchedulerConfig(
                                          max_batch_size=8, draft_length=DraftLengthConfig(policy="fixed", fixed=3),
                                          # the CPU's draft is slow: a step waits for its tokens
                                          draft_stream=DraftStreamConfig(block=stream, wait_ms=200))),
        ray=RayConfig(namespace=NAMESPACE, strategy=strategy, target_gpus=target_gpus, draft_gpus=draft_gpus,
                      target_cpus=1, draft_cpus=1, coordinator_cpus=1, target_port=fixed_port(), draft_port=fixed_port(),
                      ready_timeout_s=180),
        http=http, colocate=colocate)


def generate(address, **kw):
    with BassClient(address, timeout_s=60) as c:
        return c.generate(PROMPT, max_new_tokens=20, ignore_eos=True, **kw)


@pytest.mark.parametrize("gpus,same_gpu,stream", [((0.5, 0.5), True, 0), ((1, 1), False, 0), ((1, 1), False, 3)])
def test_up_places_services_and_serves(cluster, llama_target, llama_draft, expected, gpus, same_gpu, stream):
    """stream: the draft with a GPU of its own drafts ahead on its own while the target verifies
    what it streamed (streamed speculation): the same text."""
    from bass.deploy import launcher

    addresses = launcher.up(config(llama_target, llama_draft, target_gpus=gpus[0], draft_gpus=gpus[1],
                                   stream=stream), echo=lambda *_: None)
    try:
        where = launcher.placements(NAMESPACE)
        assert set(where) == {"target", "draft", "coordinator"}
        assert where["target"]["gpu_ids"] and where["draft"]["gpu_ids"] and not where["coordinator"]["gpu_ids"]
        assert (where["target"]["gpu_ids"] == where["draft"]["gpu_ids"]) is same_gpu
        table = ray.util.placement_group_table(ray.util.get_placement_group(launcher.PLACEMENT_GROUP))
        assert table["strategy"] == "PACK" and table["bundles"][0]["GPU"] == gpus[0]
        r = generate(addresses["coordinator"])
        assert list(r.sequences[0].token_ids) == expected and r.stats.draft_tokens > 0
    finally:
        assert set(launcher.down(NAMESPACE)) == {"target", "draft", "coordinator"}
    assert launcher.placements(NAMESPACE) == {}


def test_up_colocates_the_models_in_one_actor_by_default(cluster, llama_target, llama_draft, expected):
    """`colocate` (ServeConfig's default): one actor on the target's GPU serves both models, the
    placement group has no draft bundle, and speculation runs (one Speculate call a step)."""
    from bass.deploy import launcher

    assert ServeConfig().colocate
    addresses = launcher.up(config(llama_target, llama_draft, target_gpus=1, draft_gpus=1, colocate=True),
                            echo=lambda *_: None)
    try:
        where = launcher.placements(NAMESPACE)
        assert set(where) == {"colocated", "coordinator"} and where["colocated"]["gpu_ids"]
        assert addresses["target"] == addresses["draft"] == addresses["colocated"]
        table = ray.util.placement_group_table(ray.util.get_placement_group(launcher.PLACEMENT_GROUP))
        assert len(table["bundles"]) == 2 and table["bundles"][0] == {"GPU": 1.0, "CPU": 2.0}
        r = generate(addresses["coordinator"])
        assert list(r.sequences[0].token_ids) == expected and r.stats.draft_tokens > 0
    finally:
        assert set(launcher.down(NAMESPACE)) == {"colocated", "coordinator"}
    assert launcher.placements(NAMESPACE) == {}


def test_up_with_an_http_port_serves_openai_clients_beside_the_coordinator(cluster, llama_target, llama_draft):
    """[http] port set: `bass up` starts the OpenAI-compatible front as one more actor, in the
    coordinator's bundle (CPUs only), pointed at the coordinator, with the target's tokenizer;
    it answers what gRPC answers, and `bass down` removes it first."""
    import openai

    from bass.app.http.server import serve_http
    from bass.core.errors import InvalidRequestError
    from bass.deploy import launcher

    port = fixed_port()
    cfg = config(llama_target, llama_draft, target_gpus=1, draft_gpus=1, colocate=True,
                 http=HttpConfig(port=port, model_name="tiny"))
    with pytest.raises(InvalidRequestError, match="http.port"):  # deploy imports no front of its own
        launcher.up(cfg, echo=lambda *_: None)
    addresses = launcher.up(cfg, echo=lambda *_: None, serve_http=serve_http)
    try:
        assert addresses["http"] == f"127.0.0.1:{port}"
        where = launcher.placements(NAMESPACE)
        assert set(where) == {"colocated", "coordinator", "http"} and not where["http"]["gpu_ids"]
        assert where["http"]["node_id"] == where["coordinator"]["node_id"]
        table = ray.util.placement_group_table(ray.util.get_placement_group(launcher.PLACEMENT_GROUP))
        assert table["bundles"][1] == {"CPU": cfg.ray.coordinator_cpus + cfg.ray.http_cpus}
        with openai.OpenAI(base_url=f"http://{addresses['http']}/v1", api_key="unused", max_retries=0,
                           timeout=60) as client:
            assert [m.id for m in client.models.list()] == ["tiny"]
            r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert r.choices[0].text == generate(addresses["coordinator"]).sequences[0].text
        assert r.model_extra["bass"]["draft_tokens"] > 0
    finally:
        assert set(launcher.down(NAMESPACE)) == {"colocated", "coordinator", "http"}
    assert launcher.placements(NAMESPACE) == {}


def test_a_killed_draft_actor_restarts_and_the_coordinator_reconnects(cluster, llama_target, llama_draft, expected):
    from bass.deploy import launcher

    addresses = launcher.up(config(llama_target, llama_draft, target_gpus=0.5, draft_gpus=0.5), echo=lambda *_: None)
    try:
        draft = ray.get_actor("bass-draft", namespace=NAMESPACE)
        ray.kill(draft, no_restart=False)  # the process dies; Ray starts it again
        r = generate(addresses["coordinator"])
        assert list(r.sequences[0].token_ids) == expected  # served meanwhile (without the draft if need be)
        deadline = time.monotonic() + 90
        while True:
            r = generate(addresses["coordinator"])
            assert list(r.sequences[0].token_ids) == expected
            if r.stats.draft_tokens > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert r.stats.draft_tokens > 0, "speculation should resume once the restarted draft serves again"
        assert ray.get(ray.get_actor("bass-draft", namespace=NAMESPACE).address.remote()) == addresses["draft"]
    finally:
        launcher.down(NAMESPACE)


def test_too_few_resources_is_a_clear_error(cluster, llama_target, llama_draft):
    from bass.core.errors import CapacityError
    from bass.deploy import launcher

    with pytest.raises(CapacityError, match="need 3 GPUs"):
        launcher.up(config(llama_target, llama_draft, target_gpus=2, draft_gpus=1), echo=lambda *_: None)


def replicas_config(target, draft, replicas: int) -> ServeConfig:
    """`replicas` copies of the co-located pair, a logical GPU each, behind the router (with
    metrics, which show each replica's load)."""
    from dataclasses import replace

    from bass.core.config import RouterConfig

    base = config(target, draft, target_gpus=1, draft_gpus=1, colocate=True)
    stride = 10
    while True:  # replica i's ports are these plus i * stride: all must be free
        first = fixed_port()
        ports = [first + i * stride + d for i in range(replicas) for d in range(3)]
        if all(p < 65536 for p in ports) and all(bindable(p) for p in ports):
            break
    return replace(base, replicas=replicas,
                   coordinator=replace(base.coordinator, metrics_port=fixed_port()),
                   router=RouterConfig(poll_interval_s=0.05),
                   ray=replace(base.ray, target_port=first, draft_port=first + 1, replica_coordinator_port=first + 2,
                               replica_port_stride=stride, target_cpus=0.5, draft_cpus=0.5, coordinator_cpus=0.5,
                               router_cpus=0.5))


def test_up_with_replicas_places_a_group_each_behind_the_router(cluster, llama_target, llama_draft, expected):
    """Two replicas, each its own placement group and logical GPU, behind the router, and the
    HTTP front beside the router: the text is the target's, over gRPC and over HTTP; a killed
    replica coordinator leaves the other serving, Ray restarts it on its address and the router
    takes it back."""
    from dataclasses import replace

    import openai
    from test_metrics import scrape

    from bass.app.http.server import serve_http
    from bass.deploy import launcher

    cfg = replicas_config(llama_target, llama_draft, 2)
    cfg = replace(cfg, http=HttpConfig(port=fixed_port(), model_name="tiny"))
    addresses = launcher.up(cfg, echo=lambda *_: None, serve_http=serve_http)
    try:
        where = launcher.placements(NAMESPACE)
        assert set(where) == {"colocated-0", "colocated-1", "coordinator-0", "coordinator-1", "router", "http"}
        assert not where["http"]["gpu_ids"]
        with openai.OpenAI(base_url=f"http://{addresses['http']}/v1", api_key="unused", max_retries=0,
                           timeout=60) as client:
            r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert r.choices[0].text == generate(addresses["router"]).sequences[0].text
        gpus = [where[f"colocated-{i}"]["gpu_ids"] for i in range(2)]
        assert all(gpus) and gpus[0] != gpus[1] and not where["router"]["gpu_ids"]
        for i in range(2):
            name = launcher.REPLICA_PLACEMENT_GROUP.format(namespace=NAMESPACE, index=i)
            table = ray.util.placement_group_table(ray.util.get_placement_group(name))
            assert table["bundles"][0] == {"GPU": 1.0, "CPU": 1.0} and table["state"] == "CREATED"
        router = addresses["router"]
        assert router.endswith(f":{cfg.coordinator.port}")
        metrics = f"127.0.0.1:{cfg.coordinator.metrics_port}"
        r = generate(router, n=2)
        assert [list(s.token_ids) for s in r.sequences] == [expected] * 2 and r.stats.draft_tokens > 0

        victim = addresses["replica-0"]
        ray.kill(ray.get_actor("bass-coordinator-0", namespace=NAMESPACE), no_restart=False)
        for _ in range(3):  # served meanwhile, by the other replica
            assert list(generate(router).sequences[0].token_ids) == expected
        deadline = time.monotonic() + 120
        while scrape(metrics).get(("bass_replica_up", (("replica", victim),))) != 1:
            assert time.monotonic() < deadline, "the restarted replica did not rejoin"
            time.sleep(0.5)
        assert ray.get(ray.get_actor("bass-coordinator-0", namespace=NAMESPACE).address.remote()) == victim
        assert list(generate(router).sequences[0].token_ids) == expected
    finally:
        removed = launcher.down(NAMESPACE)
    assert set(removed) == {"http", "router", "coordinator-0", "coordinator-1", "colocated-0", "colocated-1"}
    assert launcher.placements(NAMESPACE) == {}
    assert not [t for t in ray.util.placement_group_table().values()
                if t["name"].startswith(f"bass-{NAMESPACE}-replica-") and t["state"] != "REMOVED"]


def test_more_replicas_than_gpus_is_a_clear_error(cluster, llama_target, llama_draft):
    from bass.core.errors import CapacityError
    from bass.deploy import launcher

    with pytest.raises(CapacityError, match="3 replicas .*need 3 GPUs .* has 2"):
        launcher.up(replicas_config(llama_target, llama_draft, 3), echo=lambda *_: None)


def test_replicas_that_cannot_be_placed_fail_naming_the_group_and_leave_nothing(cluster, llama_target, llama_draft):
    """The cluster has the resources in total but no placement fits (STRICT_SPREAD wants a node
    per bundle; this cluster is one node): the error names the group and the nodes' room, and
    nothing is left pending."""
    from dataclasses import replace

    from bass.core.errors import CapacityError
    from bass.deploy import launcher

    cfg = replicas_config(llama_target, llama_draft, 2)
    cfg = replace(cfg, ray=replace(cfg.ray, strategy="STRICT_SPREAD", ready_timeout_s=3))
    with pytest.raises(CapacityError, match=r"placement group bass-bass-test-replica-0 .* not placed within 3 s"):
        launcher.up(cfg, echo=lambda *_: None)
    assert launcher.placements(NAMESPACE) == {}
    assert not [t for t in ray.util.placement_group_table().values()
                if t["name"].startswith(f"bass-{NAMESPACE}-replica-") and t["state"] != "REMOVED"]
