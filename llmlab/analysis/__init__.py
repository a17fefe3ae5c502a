"""Analysis: numbers and models of inference, no display. Costs (parameters, FLOPs, bytes, KV
size), the roofline, hardware presets and this machine's measurements, the batching and memory
simulators, serving metrics, the parallelism cost model. Imports the engine, never the course."""
