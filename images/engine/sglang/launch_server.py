# `python -m sglang.launch_server ...`: the engine stand-in playing SGLang.
import standin

standin.run("sglang")
