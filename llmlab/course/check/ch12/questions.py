"""The source chapter's five self-check questions, with the checkers that ask each; the chapter's
exercises, read from its catalog."""

from __future__ import annotations

from llmlab.course.check.catalog import catalog
from llmlab.i18n import Bilingual

M = catalog("ch12")


# The source chapter's five self-check questions, each with the checkers (module, function) for it.
SEED_QUESTIONS_EN: dict[int, tuple[str, tuple[tuple[str, str], ...]]] = {
    1: (
        "Draw the loop input -> tokens -> forward -> sample; mark where the KV cache is read and written.",
        (("ch12", "generation_loop_steps"), ("ch05", "write_before_read"), ("ch05", "cache_reads")),
    ),
    2: (
        "Llama-3-70B (80 layers, BF16, GQA): KV bytes per token, and GB for a 4K-token request.",
        (
            ("ch04", "kv_bytes_per_token"),
            ("ch04", "kv_gb_for_request"),
            ("ch12", "kv_gb_fresh_case"),
        ),
    ),
    3: (
        "Why does batch 32 give nearly 32x the throughput at nearly the same latency?",
        (("ch08", "source_q3"), ("ch12", "q3_fresh_case")),
    ),
    4: (
        "Which of TTFT / TPOT / throughput matters most for chat, batch jobs, code completion?",
        (("ch10", "source_q4"), ("ch12", "q4_fresh_case")),
    ),
    5: (
        "Map an operating-system idea to a vLLM design.",
        (("ch11", "source_q5"), ("ch12", "q5_fresh_case")),
    ),
}

# The same questions in the source chapter's own words, for the notebook to print with
# tr(text, SEED_QUESTIONS_ZH[q]).
SEED_QUESTIONS_ZH: dict[int, str] = {
    1: '「画出"用户输入 → token → forward → 采样"这条循环，并标出哪一步会读 / 写 KV cache。」（引自原章节）',
    2: "「Llama-3-70B（80 层、hidden=8192、BF16）一个 token 在 KV cache 里占多少字节，1 个 4K-token "
    "请求需要多少 GB？」（引自原章节）",
    3: "「为什么 batch=32 的吞吐能接近 batch=1 的 32 倍，但 batch=1 的延迟和 batch=32 的延迟相差不大？」（引自原章节）",
    4: "「给真实场景，TTFT / TPOT / 吞吐 优先级？」（引自原章节）聊天、离线批量任务、代码补全各看重哪个？",
    5: "「用 OS / 体系结构 / 分布式 课里学过的一个概念，对应 vLLM 后面要讲的某项设计。」（引自原章节）",
}
# shown in the language in use; the keys are what the student answers with
SEED_QUESTIONS = Bilingual(SEED_QUESTIONS_EN, SEED_QUESTIONS_ZH)

EXERCISES = M.exercises()  # kind, source question, mistakes: the catalog's "exercises"
