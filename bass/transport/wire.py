"""Conversions between the step contract (bass.core.worker_api) and its protobuf messages.

Everything that crosses a process boundary goes through here, so the servicers and clients
stay thin and the two representations cannot drift apart unnoticed (tests round-trip them).
"""

from __future__ import annotations

import itertools
from typing import Sequence

from bass.core.config import SamplingParams
from bass.core.errors import InvalidRequestError
from bass.core.worker_api import (AddSequence, FollowSequence, ProposeItem, ProposeRequest, ProposeResponse,
                                  SequenceSampling, SpeculateRequest, SpeculateResponse, StreamCommit, StreamControl,
                                  StreamDrafts, Verdict, VerifyItem, VerifyRequest, VerifyResponse, WorkerInfo)
from bass.v1 import worker_pb2 as pb


# -- info -------------------------------------------------------------------------------------------
def info_to_proto(info: WorkerInfo) -> pb.WorkerInfo:
    return pb.WorkerInfo(model_name=info.model_name, vocab_size=info.vocab_size, num_slots=info.num_slots,
                         max_seq_len=info.max_seq_len, dtype=info.dtype, device=info.device,
                         eos_token_ids=list(info.eos_token_ids), instance_id=info.instance_id)


def info_from_proto(m: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(model_name=m.model_name, vocab_size=m.vocab_size, num_slots=m.num_slots,
                      max_seq_len=m.max_seq_len, dtype=m.dtype, device=m.device,
                      eos_token_ids=tuple(m.eos_token_ids), instance_id=m.instance_id)


# -- shared pieces ------------------------------------------------------------------------------------
def _add_to_proto(a: AddSequence) -> pb.AddSequence:
    m = pb.AddSequence(seq_id=a.seq_id, prompt_ids=list(a.prompt_ids))
    if a.parent_id is not None:
        m.parent_id = a.parent_id
    return m


def _add_from_proto(m: pb.AddSequence) -> AddSequence:
    return AddSequence(seq_id=m.seq_id, prompt_ids=tuple(m.prompt_ids),
                       parent_id=m.parent_id if m.HasField("parent_id") else None)


def _sampling_to_proto(samplings: Sequence[SequenceSampling]) -> pb.SamplingColumns:
    params = [s.params for s in samplings]
    return pb.SamplingColumns(temperature=[p.temperature for p in params], top_k=[p.top_k for p in params],
                              top_p=[p.top_p for p in params], seed_key=[s.seed_key for s in samplings])


def _sampling_from_proto(m: pb.SamplingColumns, n: int) -> list[SequenceSampling]:
    columns = (m.temperature, m.top_k, m.top_p, m.seed_key)
    _require_lengths("sampling", n, *columns)
    # A batch shares a few settings: each distinct one is validated once per call.
    # float32 on the wire: the worker must shape with exactly what it received.
    params: dict[tuple, SamplingParams] = {}
    out = []
    for t, k, p, key in zip(*columns):
        shape = (t, k, p)
        sp = params.get(shape)
        if sp is None:
            sp = params[shape] = SamplingParams(temperature=t, top_k=k, top_p=p or 1.0)
        out.append(SequenceSampling(sp, seed_key=key))
    return out


def _require_lengths(field: str, n: int, *columns) -> None:
    if any(len(c) != n for c in columns):
        raise InvalidRequestError(field, f"every column must have one entry per sequence ({n}); "
                                         f"got {[len(c) for c in columns]}")


def _split(flat, counts, field: str) -> list[tuple[int, ...]]:
    """Concatenated lists back into one tuple per sequence."""
    flat = tuple(flat)
    ends = list(itertools.accumulate(counts))
    total = ends[-1] if ends else 0
    if total != len(flat):
        raise InvalidRequestError(field, f"the counts add up to {total} tokens, but {len(flat)} were sent")
    return [flat[e - c:e] for c, e in zip(counts, ends)]


# -- propose ---------------------------------------------------------------------------------------
def propose_request_to_proto(r: ProposeRequest) -> pb.ProposeRequest:
    items = r.items
    return pb.ProposeRequest(
        seq_ids=[i.seq_id for i in items], num_tokens=[i.num_tokens for i in items],
        committed_counts=[len(i.committed) for i in items], committed=[t for i in items for t in i.committed],
        sampling=_sampling_to_proto([i.sampling for i in items]),
        add=[_add_to_proto(a) for a in r.add], release=list(r.release),
        assumed_counts=[len(i.assumed) for i in items] if any(i.assumed for i in items) else [],
        assumed=[t for i in items for t in i.assumed])


def propose_request_from_proto(m: pb.ProposeRequest) -> ProposeRequest:
    n = len(m.seq_ids)
    _require_lengths("seq_ids", n, m.num_tokens, m.committed_counts)
    committed = _split(m.committed, m.committed_counts, "committed")
    samplings = _sampling_from_proto(m.sampling, n)
    if m.assumed_counts:
        _require_lengths("seq_ids", n, m.assumed_counts)
        assumed = _split(m.assumed, m.assumed_counts, "assumed")
    elif m.assumed:
        raise InvalidRequestError("assumed", f"{len(m.assumed)} tokens sent without assumed_counts")
    else:
        assumed = [()] * n
    return ProposeRequest(
        items=[ProposeItem(*fields) for fields in zip(m.seq_ids, m.num_tokens, committed, samplings, assumed)],
        add=[_add_from_proto(a) for a in m.add], release=list(m.release))


def propose_response_to_proto(r: ProposeResponse) -> pb.ProposeResponse:
    return pb.ProposeResponse(counts=[len(t) for t in r.tokens], tokens=[x for t in r.tokens for x in t],
                              compute_s=r.compute_s)


def propose_response_from_proto(m: pb.ProposeResponse) -> ProposeResponse:
    return ProposeResponse(tokens=[list(t) for t in _split(m.tokens, m.counts, "tokens")], compute_s=m.compute_s)


# -- verify ----------------------------------------------------------------------------------------
def verify_request_to_proto(r: VerifyRequest) -> pb.VerifyRequest:
    items = r.items
    return pb.VerifyRequest(
        seq_ids=[i.seq_id for i in items], draft_counts=[len(i.draft_tokens) for i in items],
        draft_tokens=[t for i in items for t in i.draft_tokens],
        sampling=_sampling_to_proto([i.sampling for i in items]),
        add=[_add_to_proto(a) for a in r.add], release=list(r.release))


def verify_request_from_proto(m: pb.VerifyRequest) -> VerifyRequest:
    n = len(m.seq_ids)
    _require_lengths("seq_ids", n, m.draft_counts)
    drafts = _split(m.draft_tokens, m.draft_counts, "draft_tokens")
    samplings = _sampling_from_proto(m.sampling, n)
    return VerifyRequest(items=[VerifyItem(*fields) for fields in zip(m.seq_ids, drafts, samplings)],
                         add=[_add_from_proto(a) for a in m.add], release=list(m.release))


def verify_response_to_proto(r: VerifyResponse) -> pb.VerifyResponse:
    verdicts = r.verdicts
    return pb.VerifyResponse(accepted=[v.accepted for v in verdicts], counts=[len(v.tokens) for v in verdicts],
                             tokens=[t for v in verdicts for t in v.tokens], compute_s=r.compute_s,
                             device_wait_s=r.device_wait_s)


def verify_response_from_proto(m: pb.VerifyResponse) -> VerifyResponse:
    _require_lengths("accepted", len(m.counts), m.accepted)
    tokens = _split(m.tokens, m.counts, "tokens")
    return VerifyResponse(verdicts=[Verdict(a, list(t)) for a, t in zip(m.accepted, tokens)], compute_s=m.compute_s,
                          device_wait_s=m.device_wait_s)


# -- speculate (a co-located draft and target) --------------------------------------------------------
def speculate_request_to_proto(r: SpeculateRequest) -> pb.SpeculateRequest:
    m = pb.SpeculateRequest(verify=verify_request_to_proto(r.verify), use_chained=r.propose is None)
    if r.propose is not None:
        m.propose.CopyFrom(propose_request_to_proto(r.propose))
    if r.chain is not None:
        m.chain.CopyFrom(propose_request_to_proto(r.chain))
    return m


def speculate_request_from_proto(m: pb.SpeculateRequest) -> SpeculateRequest:
    if m.use_chained == m.HasField("propose"):
        raise InvalidRequestError("propose", "give a proposal or use_chained, exactly one")
    verify = verify_request_from_proto(m.verify)
    if any(item.draft_tokens for item in verify.items):
        raise InvalidRequestError("verify.draft_tokens", "must be empty: the drafts are the proposal's")
    return SpeculateRequest(verify=verify,
                            propose=propose_request_from_proto(m.propose) if m.HasField("propose") else None,
                            chain=propose_request_from_proto(m.chain) if m.HasField("chain") else None)


def speculate_response_to_proto(r: SpeculateResponse) -> pb.SpeculateResponse:
    return pb.SpeculateResponse(propose=propose_response_to_proto(r.propose), verify=verify_response_to_proto(r.verify),
                                chained=r.chained, chained_gpu_s=r.chained_gpu_s)


def speculate_response_from_proto(m: pb.SpeculateResponse) -> SpeculateResponse:
    return SpeculateResponse(propose=propose_response_from_proto(m.propose),
                             verify=verify_response_from_proto(m.verify), chained=m.chained,
                             chained_gpu_s=m.chained_gpu_s)


# -- draft stream ----------------------------------------------------------------------------------
def stream_control_to_proto(c: StreamControl) -> pb.StreamControl:
    return pb.StreamControl(
        release=list(c.release), add=[_add_to_proto(a) for a in c.add],
        follow_ids=[f.seq_id for f in c.follow], follow_sampling=_sampling_to_proto([f.sampling for f in c.follow]),
        commit_ids=[x.seq_id for x in c.commits], commit_counts=[len(x.tokens) for x in c.commits],
        commit_tokens=[t for x in c.commits for t in x.tokens], lookahead=c.lookahead, chunk=c.chunk)


def stream_control_from_proto(m: pb.StreamControl) -> StreamControl:
    _require_lengths("commit_ids", len(m.commit_ids), m.commit_counts)
    follow = [FollowSequence(seq_id, sampling) for seq_id, sampling
              in zip(m.follow_ids, _sampling_from_proto(m.follow_sampling, len(m.follow_ids)))]
    commits = [StreamCommit(seq_id, tokens) for seq_id, tokens
               in zip(m.commit_ids, _split(m.commit_tokens, m.commit_counts, "commit_tokens"))]
    return StreamControl(add=[_add_from_proto(a) for a in m.add], follow=follow, commits=commits,
                         release=list(m.release), lookahead=m.lookahead, chunk=m.chunk)


def stream_drafts_to_proto(drafts: Sequence[StreamDrafts], busy_s: float = 0.0) -> pb.StreamDrafts:
    return pb.StreamDrafts(seq_ids=[d.seq_id for d in drafts], epochs=[d.epoch for d in drafts],
                           positions=[d.position for d in drafts], counts=[len(d.tokens) for d in drafts],
                           tokens=[t for d in drafts for t in d.tokens], busy_s=busy_s)


def stream_drafts_from_proto(m: pb.StreamDrafts) -> list[StreamDrafts]:
    _require_lengths("seq_ids", len(m.seq_ids), m.epochs, m.positions, m.counts)
    return [StreamDrafts(*fields) for fields
            in zip(m.seq_ids, m.epochs, m.positions, _split(m.tokens, m.counts, "tokens"))]
