"""Internal: a simulated vLLM prefill/decode pair that replays the incident of PRODUCT.md in accelerated
time: real metric names and labels, real log formats, step records through the recorder's
ring-file channel, an Xid line in a simulated kernel log, and the decode engine's death."""
