"""Start small torchrun jobs in the background, watch every rank, catch stalls with evidence."""

from rankscope.launch.capture import capture_evidence
from rankscope.launch.job import Job
from rankscope.launch.spec import DEFAULT_PRESETS, PRESETS, JobSpec, Preset

__all__ = [
    "DEFAULT_PRESETS",
    "PRESETS",
    "Job",
    "JobSpec",
    "Preset",
    "capture_evidence",
]
