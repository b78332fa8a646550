"""Internal: anomaly detectors: pure functions over the live series, and the runner that gates them."""

from collector.detectors.base import DetectorState, Hysteresis, Transition
from collector.detectors.config import DetectorThresholds
from collector.detectors.runner import DetectorRunner

__all__ = ["DetectorRunner", "DetectorState", "DetectorThresholds", "Hysteresis", "Transition"]
