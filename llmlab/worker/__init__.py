"""The worker side of a step (vLLM: `vllm/v1/worker/`): `model_runner` turns a scheduled step
into one forward and its sampled tokens; `input_batch` builds the step's arrays and sends them
to the device in one transfer; `cuda_graphs` captures and replays decode steps on a GPU."""
