"""The generated gRPC code is current, and the wire conversions are lossless."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from bass import wire
from bass.config import SamplingParams
from bass.worker_api import (AddSequence, ProposeItem, ProposeRequest, ProposeResponse,
                             SequenceSampling, VerifyItem, VerifyRequest)

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
