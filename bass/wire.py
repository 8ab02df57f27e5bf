"""Conversions between the step contract (bass.worker_api) and its protobuf messages.

Everything that crosses a process boundary goes through here, so the servicers and clients
stay thin and the two representations cannot drift apart unnoticed (tests round-trip them).
"""

from __future__ import annotations

from bass.config import SamplingParams
from bass.v1 import worker_pb2 as pb
from bass.worker_api import (AddSequence, ProposeItem, ProposeRequest, ProposeResponse,
                             SequenceSampling, Verdict, VerifyItem, VerifyRequest, VerifyResponse, WorkerInfo)


# -- info -------------------------------------------------------------------------------------------
def info_to_proto(info: WorkerInfo) -> pb.WorkerInfo:
    return pb.WorkerInfo(model_name=info.model_name, vocab_size=info.vocab_size, num_slots=info.num_slots,
                         max_seq_len=info.max_seq_len, dtype=info.dtype, device=info.device,
                         eos_token_ids=list(info.eos_token_ids))


def info_from_proto(m: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(model_name=m.model_name, vocab_size=m.vocab_size, num_slots=m.num_slots,
                      max_seq_len=m.max_seq_len, dtype=m.dtype, device=m.device,
                      eos_token_ids=tuple(m.eos_token_ids))


# -- shared pieces ------------------------------------------------------------------------------------
def _add_to_proto(a: AddSequence) -> pb.AddSequence:
    m = pb.AddSequence(seq_id=a.seq_id, prompt_ids=list(a.prompt_ids))
    if a.parent_id is not None:
        m.parent_id = a.parent_id
    return m


def _add_from_proto(m: pb.AddSequence) -> AddSequence:
    return AddSequence(seq_id=m.seq_id, prompt_ids=tuple(m.prompt_ids),
                       parent_id=m.parent_id if m.HasField("parent_id") else None)


def _sampling_to_proto(s: SequenceSampling) -> pb.Sampling:
    p = s.params
    return pb.Sampling(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed_key=s.seed_key)


def _sampling_from_proto(m: pb.Sampling) -> SequenceSampling:
    # float32 on the wire: the worker must shape with exactly what it received.
    return SequenceSampling(SamplingParams(temperature=m.temperature, top_k=m.top_k, top_p=m.top_p or 1.0),
                            seed_key=m.seed_key)


# -- propose ---------------------------------------------------------------------------------------
def propose_request_to_proto(r: ProposeRequest) -> pb.ProposeRequest:
    return pb.ProposeRequest(
        items=[pb.ProposeItem(seq_id=i.seq_id, num_tokens=i.num_tokens, committed=list(i.committed),
                              sampling=_sampling_to_proto(i.sampling)) for i in r.items],
        add=[_add_to_proto(a) for a in r.add], release=list(r.release))


def propose_request_from_proto(m: pb.ProposeRequest) -> ProposeRequest:
    return ProposeRequest(
        items=[ProposeItem(seq_id=i.seq_id, num_tokens=i.num_tokens, committed=tuple(i.committed),
                           sampling=_sampling_from_proto(i.sampling)) for i in m.items],
        add=[_add_from_proto(a) for a in m.add], release=list(m.release))


def propose_response_to_proto(r: ProposeResponse) -> pb.ProposeResponse:
    return pb.ProposeResponse(proposals=[pb.Proposal(tokens=t) for t in r.tokens], compute_s=r.compute_s)


def propose_response_from_proto(m: pb.ProposeResponse) -> ProposeResponse:
    return ProposeResponse(tokens=[list(p.tokens) for p in m.proposals], compute_s=m.compute_s)


# -- verify ----------------------------------------------------------------------------------------
def verify_request_to_proto(r: VerifyRequest) -> pb.VerifyRequest:
    return pb.VerifyRequest(
        items=[pb.VerifyItem(seq_id=i.seq_id, draft_tokens=list(i.draft_tokens), sampling=_sampling_to_proto(i.sampling))
               for i in r.items],
        add=[_add_to_proto(a) for a in r.add], release=list(r.release))


def verify_request_from_proto(m: pb.VerifyRequest) -> VerifyRequest:
    return VerifyRequest(
        items=[VerifyItem(seq_id=i.seq_id, draft_tokens=tuple(i.draft_tokens), sampling=_sampling_from_proto(i.sampling))
               for i in m.items],
        add=[_add_from_proto(a) for a in m.add], release=list(m.release))


def verify_response_to_proto(r: VerifyResponse) -> pb.VerifyResponse:
    return pb.VerifyResponse(verdicts=[pb.Verdict(accepted=v.accepted, tokens=v.tokens) for v in r.verdicts],
                             compute_s=r.compute_s)


def verify_response_from_proto(m: pb.VerifyResponse) -> VerifyResponse:
    return VerifyResponse(verdicts=[Verdict(accepted=v.accepted, tokens=list(v.tokens)) for v in m.verdicts],
                          compute_s=m.compute_s)
