"""The generated gRPC code is current, and the wire conversions are lossless."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from bass.core.config import SamplingParams
from bass.core.worker_api import (AddSequence, ProposeItem, ProposeRequest, ProposeResponse, SequenceSampling, Verdict,
                                  VerifyItem, VerifyRequest, VerifyResponse)
from bass.transport import wire

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_matches_the_protos(tmp_path):
    check = subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--check"], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr
    spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(tmp_path)
    for fresh in (tmp_path / "bass" / "v1").iterdir():
        assert fresh.read_bytes() == (ROOT / "bass" / "v1" / fresh.name).read_bytes(), fresh.name


def sampling(seed_key=2**64 - 5):
    return SequenceSampling(SamplingParams(temperature=0.5, top_k=7, top_p=0.75), seed_key=seed_key)


def test_propose_round_trip():
    req = ProposeRequest(items=[ProposeItem(3, 4, (1, 2), sampling())],
                         add=[AddSequence(3, (5, 6, 7)), AddSequence(4, parent_id=3)], release=[9, 10])
    assert wire.propose_request_from_proto(wire.propose_request_to_proto(req)) == req
    resp = ProposeResponse(tokens=[[5, 2], []], compute_s=0.25)
    assert wire.propose_response_from_proto(wire.propose_response_to_proto(resp)) == resp


def test_verify_round_trip():
    req = VerifyRequest(items=[VerifyItem(1, (4, 5, 6), sampling()), VerifyItem(2, (), sampling(7))],
                        add=[AddSequence(2, (1,))], release=[2])
    back = wire.verify_request_from_proto(wire.verify_request_to_proto(req))
    assert back.items == req.items and back.add == req.add and back.release == [2]
    resp = VerifyResponse(verdicts=[Verdict(2, [4, 5, 9]), Verdict(0, [3])], compute_s=0.5, device_wait_s=0.25)
    assert wire.verify_response_from_proto(wire.verify_response_to_proto(resp)) == resp


def test_a_batch_shares_validated_sampling_settings_and_keeps_its_own_keys():
    shared = SamplingParams(temperature=0.8, top_p=0.95)
    items = [VerifyItem(i, (), SequenceSampling(shared, seed_key=100 + i)) for i in range(1, 5)]
    items.append(VerifyItem(9, (1,), SequenceSampling(SamplingParams(), seed_key=7)))
    back = wire.verify_request_from_proto(wire.verify_request_to_proto(VerifyRequest(items=items)))
    assert [i.sampling.seed_key for i in back.items] == [101, 102, 103, 104, 7]
    assert back.items[0].sampling.params is back.items[3].sampling.params  # validated once per call
    assert back.items[4].sampling.params.greedy and not back.items[0].sampling.params.greedy
    # float32 on the wire: the worker shapes with what it received, not the coordinator's float64.
    assert back.items[0].sampling.params.top_p == pytest.approx(0.95, abs=1e-7)
