"""Profile regular sampled decoding (T = 0.8, top-p 0.95, batch 8) in-process: top ops by CPU and CUDA time."""
import sys

from torch.profiler import ProfilerActivity, profile

from bass.core.config import DraftLengthConfig, RunnerConfig, SamplingParams, SchedulerConfig
from bass.coordinator.requests import GenerationRequest
from bass.app.local import build_local_scheduler

T, D = sys.argv[1], sys.argv[2]
cfg = dict(device="cuda", dtype="bfloat16", num_slots=8, max_seq_len=1024)
s = build_local_scheduler(RunnerConfig(model_dir=T, **cfg), RunnerConfig(model_dir=D, **cfg),
                          scheduler=SchedulerConfig(draft_length=DraftLengthConfig.parse(sys.argv[3])))
reqs = lambda n: [GenerationRequest(prompt_ids=tuple(range(100 + i, 140 + i)), max_new_tokens=n, ignore_eos=True,
                                    sampling=SamplingParams(temperature=0.8, top_p=0.95)) for i in range(8)]
s.generate(reqs(16))
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    s.generate(reqs(32))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
