"""Column headers of the printed tables, in Chinese.

The notebooks build their tables with English keys (the notebook code is the same in both
languages); the table helpers (`figures.ch06.table_text`, `figures.ch08.text_table`,
`widgets.blocks.table_text`) print each header (and `figures.ch06.table_text` each row label)
through `header`, which gives the Chinese header of this table when the language is Chinese. A
header not listed here is printed as it is (numbers, units, code names). The table itself,
aligned by screen columns (a Chinese character takes two), is `llmlab.utils.format_table`.
"""

from __future__ import annotations

from llmlab.i18n import tr

HEADERS_ZH = {
    # chapter 06: the memory of a chip, presets and this machine
    "preset": "预设",
    "SRAM, all SMs": "SRAM，所有 SM 合计",
    "HBM / one SM's SRAM": "HBM / 单个 SM 的 SRAM",
    "HBM / all SRAM": "HBM / 全部 SRAM",
    "HBM / memory": "HBM / 显存",
    "bandwidth TB/s": "带宽 TB/s",
    "SRAM per SM": "每个 SM 的 SRAM",
    "SMs": "SM 数",
    "floor ms": "下限 ms",
    "tokens/s, one user": "tokens/s，单个用户",
    "working set": "工作集",
    "largest cache": "最大的缓存",
    "main-memory bandwidth": "主存带宽",
    "SmolLM2 fp32 read once": "SmolLM2 fp32 读一遍",
    "this machine (measured)": "这台机器（实测）",
    "H100-SXM (preset)": "H100-SXM（预设）",
    # chapter 07: the roofline
    "ridge FLOP/B": "拐点 FLOP/B",
    "decode step": "decode step",
    "measured ms": "实测 ms",
    "memory floor ms": "读内存的下限 ms",
    "compute floor ms": "计算的下限 ms",
    "compute-bound from batch": "从这个 batch 起 compute-bound",
    "measured bend at batch": "实测拐弯处的 batch",
    "batch-1 step / memory floor": "batch 1 的一步 / 读内存的下限",
    "GEMV stream GB/s": "GEMV 读取速度 GB/s",
    "H100-SXM (preset, bf16)": "H100-SXM（预设，bf16）",
    # chapter 08: batching
    "step ms": "每步 ms",
    "bound": "瓶颈",
    "device": "设备",
    "throughput ratio": "吞吐之比",
    "policy": "策略",
    "source": "来源",
    "steps": "步数",
    "throughput": "吞吐",
    "mean batch": "平均 batch",
    "mean latency s": "平均延迟 s",
    # chapter 09: parallelism
    "arrivals/s": "到达/s",
    "replicas": "副本数",
    "theory": "理论值",
    "measured": "实测",
    "pass ms": "一轮 ms",
    "link": "链路",
    "compute ms": "计算 ms",
    "comm ms": "通信 ms",
    "comm share %": "通信占比 %",
    # chapter 11: blocks, chunked prefill, the engine
    "scheme": "方案",
    "slots wasted": "浪费的槽位",
    "block": "块",
    "held by": "持有者",
    "hash": "哈希",
    "cached tokens": "缓存的 token",
    "free-queue place": "在空闲块队列中的位置",
    "B token": "B 的 token",
    "logical block": "逻辑块",
    "physical block": "物理 KV 块",
    "offset": "偏移",
    "slot": "槽位",
    "step": "步",
    "value": "数值",
    "where": "场景",
    "throughput gain": "吞吐提升",
}


def header(text: str) -> str:
    """`text` as a table header in the language in use (unchanged in English, and for headers
    HEADERS_ZH does not list)."""
    return tr(text, HEADERS_ZH.get(text, text))
