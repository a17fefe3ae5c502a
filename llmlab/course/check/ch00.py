"""Chapter 00 self-checks: finding your way around the course, and two predictions made before
any measurement (which phase of a request dominates; which chapter explains a symptom)."""

from __future__ import annotations

from typing import Any

from llmlab.course.check.core import (
    NOT_ANSWERED,
    CheckResult,
    ExerciseInfo,
    check_choice,
    check_matching,
    check_number,
    not_yet,
    passed,
    report,
    staged,
)
from llmlab.i18n import Bilingual, tr

CHAPTERS = 13  # notebooks 00 … 12

LETTERS = "abcdefgh"


def _lettered(options: tuple[tuple[str, bool], ...]) -> tuple[list[str], set[str]]:
    """The letters of `options` (shown in this order) and the letters of the right ones.

    The letters are computed from the order, so no answer is written out in this module."""
    letters = list(LETTERS[: len(options)])
    return letters, {letter for letter, (_, right) in zip(letters, options) if right}


def options_text(options: tuple[tuple[str, bool], ...]) -> str:
    """The options as the notebook lists them in markdown: "- (a) ..." one per line."""
    return "\n".join(f"- ({letter}) {text}" for letter, (text, _) in zip(LETTERS, options))


# ----------------------------------------------------------------------------- the series' question

# Exercise 00.1: the two goals of the series' question, and what pulls them apart.
GOALS_OPTIONS = (
    ("a GPU whose memory is faster", False),
    (
        "keeping the keys and values of earlier tokens instead of recomputing them (a KV cache)",
        False,
    ),
    ("putting more users' requests into each step of the model (batching)", True),
    ("a smaller model", False),
)


def throughput_vs_wait(answer: Any) -> CheckResult:
    """The series' question pits two goals against each other: as many users as possible at once,
    and each user's wait as short as possible. Which change serves the first and can hurt the
    second? One letter of GOALS_OPTIONS."""
    ex = "ch00.throughput_vs_wait"
    letters, right = _lettered(GOALS_OPTIONS)
    both = tr(
        "it makes every step shorter, so it helps both goals at once; look for the change that "
        "shares a step among users.",
        "它让每一步都变短，所以两个目标同时受益；找一找让多个用户共用一步的那个改动。",
    )
    then = tr(
        "A step that carries more users' tokens serves more users per second, but each user's "
        "next token waits for the whole step, and a new request may wait for a place in it.",
        "一步里装下更多用户的 token，每秒能服务的用户就更多；但每个用户的下一个 token 都要等整步算完，"
        "新来的请求还可能要等到一个空位。",
    )
    hints = {
        letters[0]: staged(ex, both, then),
        letters[1]: staged(
            ex,
            tr(
                "a KV cache makes each token cheaper to produce: it shortens waits too.",
                "KV cache 让每个 token 都算得更省：它也缩短了等待。",
            ),
            then,
        ),
        letters[3]: staged(
            ex,
            tr(
                "a smaller model reads fewer bytes per step: both goals gain "
                "(what it costs is answer quality, not waiting).",
                "小模型每一步读的字节更少：两个目标都受益（它的代价是回答的质量，不是等待）。",
            ),
            then,
        ),
    }
    return check_choice(ex, answer, right, options=letters, hints=hints)


# Exercise 00.2: how the course treats a number, as the top of the chapter says.
NUMBER_KINDS = ("derive", "measure", "compute")
NUMBERS_EN = {
    "head_size_of_hidden_4096_and_32_heads": "the size of one attention head, hidden size 4096 over 32 heads",
    "tokens_per_english_word": "how many tokens an English word takes, on average",
    "decode_step_ms_70b_on_h100": "the time of one decode step of a 70B model on an H100",
    "kv_bytes_per_token_llama3_70b": "the bytes of KV cache one token of Llama-3-70B needs",
    "ms_per_token_smollm2_here": "the time SmolLM2 takes per generated token",
}
NUMBERS_ZH = {
    "head_size_of_hidden_4096_and_32_heads": "一个注意力头的维度：hidden size 4096 分给 32 个头",
    "tokens_per_english_word": "一个英文单词平均占几个 token",
    "decode_step_ms_70b_on_h100": "70B 模型在 H100 上一步 decode 的时间",
    "kv_bytes_per_token_llama3_70b": "Llama-3-70B 每个 token 需要多少字节的 KV cache",
    "ms_per_token_smollm2_here": "SmolLM2 每生成一个 token 要花多少时间",
}
# shown in the language in use; the keys are what the student answers with
NUMBERS = Bilingual(NUMBERS_EN, NUMBERS_ZH)
_NUMBER_KIND = {
    "head_size_of_hidden_4096_and_32_heads": "derive",
    "tokens_per_english_word": "measure",
    "decode_step_ms_70b_on_h100": "compute",
    "kv_bytes_per_token_llama3_70b": "derive",
    "ms_per_token_smollm2_here": "measure",
}
_NUMBER_HINTS = {  # (English, Chinese)
    "head_size_of_hidden_4096_and_32_heads": (
        "a model's configuration fixes it: no machine is needed.",
        "模型配置就决定了它：用不着任何机器。",
    ),
    "tokens_per_english_word": (
        "the real tokenizer runs here, and its count is the same on any computer.",
        "真实的分词器在这里就能运行，而且它数出来的结果在任何计算机上都一样。",
    ),
    "decode_step_ms_70b_on_h100": (
        "the course runs without a GPU: where does an H100's figure come from then?",
        "本课程不用 GPU 就能运行：那 H100 的数字从哪里来？",
    ),
    "kv_bytes_per_token_llama3_70b": (
        "layers, KV heads, head size and bytes per number are in the configuration.",
        "层数、KV 头数、头的维度和每个数的字节数都在模型配置里。",
    ),
    "ms_per_token_smollm2_here": (
        "the model runs on this machine: its time is this machine's, to be timed, not derived.",
        "模型就在这台机器上运行：它的时间属于这台机器，要计时，不是推导出来的。",
    ),
}


def number_kinds(answer: Any) -> CheckResult:
    """For each number in NUMBERS, how the course gets it: "derive" (from a model's configuration),
    "measure" (on this machine) or "compute" (from published GPU specifications)."""
    return check_matching(
        "ch00.number_kinds",
        answer,
        dict(_NUMBER_KIND),
        choices=NUMBER_KINDS,
        hints={k: tr(*v) for k, v in _NUMBER_HINTS.items()},
        success=tr(
            "correct: a configuration is derived from, this machine measured, "
            "and a GPU you do not have computed from its datasheet.",
            "正确：配置拿来推导，这台机器拿来实测，手上没有的 GPU 按数据手册计算。",
        ),
    )


# ----------------------------------------------------------------------------- predictions

# The request the prediction is about (the notebook prints these).
DOMINANT_MODEL, DOMINANT_GPU = "llama-3-8b", "H100-SXM"
PROMPT_TOKENS, REPLY_TOKENS = 1000, 200

DOMINANT_OPTIONS = (
    ("the prefill: one forward over the prompt tokens", False),
    ("the decode: one forward per reply token", True),
    ("about the same (within a factor of 2)", False),
)


def phase_floors() -> tuple[float, float]:
    """(prefill, all decode steps) least times in seconds on DOMINANT_GPU, from the presets."""
    from llmlab.analysis import roofline
    from llmlab.config import get_config

    cfg = get_config(DOMINANT_MODEL)
    prefill = roofline.place(roofline.prefill_step(cfg, PROMPT_TOKENS), DOMINANT_GPU).time_floor
    decode = sum(
        roofline.decode_step_floor(cfg, DOMINANT_GPU, 1, PROMPT_TOKENS + i)
        for i in range(REPLY_TOKENS)
    )
    return prefill, decode


def dominant_step(answer: Any) -> CheckResult:
    """One request alone on the GPU: PROMPT_TOKENS prompt tokens, REPLY_TOKENS reply tokens.
    Which phase takes longer in total? One letter of DOMINANT_OPTIONS."""
    ex = "ch00.dominant_step"
    letters, _ = _lettered(DOMINANT_OPTIONS)
    prefill, decode = phase_floors()
    if decode > 2 * prefill:
        right = {letters[1]}
    elif prefill > 2 * decode:
        right = {letters[0]}
    else:
        right = {letters[2]}
    first = {
        letters[0]: tr(
            "you weighed the phases by their token counts. The prefill has more tokens, "
            "but it handles all of them in one forward.",
            "你是按 token 数来掂量两个阶段的。prefill 的 token 更多，但它一次前向计算"
            "就处理完全部 token。",
        ),
        letters[2]: tr(
            "the two phases are far apart: count how many forwards each phase runs, "
            "and what each forward has to read.",
            "两个阶段差得很远：数一数每个阶段要做几次前向计算，每次前向计算又要读些什么。",
        ),
        letters[1]: tr(
            "the other phase has far more arithmetic: count the FLOPs of each.",
            "另一个阶段的计算量大得多：分别数一数两者的 FLOPs。",
        ),
    }
    then = tr(
        "Each forward reads every weight once from memory (16 GB here), however many tokens "
        "it carries; a forward takes about max(bytes read / bandwidth, FLOPs / peak).",
        "每次前向计算都要把全部权重从显存读一遍（这里是 16 GB），不管它带着多少个 token；"
        "一次前向计算大约耗时 max(读的字节数 / 带宽, FLOPs / 峰值算力)。",
    )
    if isinstance(answer, str) and answer.strip().lower() in right:
        return report(
            passed(
                ex,
                tr(
                    f"correct. The presets give at least {prefill * 1e3:.0f} ms for "
                    f"the prefill and {decode * 1e3:.0f} ms for the decode steps; "
                    f"chapters 05 and 07 derive why.",
                    f"正确。按预设参数，prefill 至少要 {prefill * 1e3:.0f} ms，"
                    f"decode 各步合计至少 {decode * 1e3:.0f} ms；第 05 章和第 07 章"
                    f"会推导其中的原因。",
                ),
            )
        )
    return check_choice(
        ex, answer, right, options=letters, hints={k: staged(ex, v, then) for k, v in first.items()}
    )


# Symptoms a reader of the source chapter meets in practice → the chapter whose idea explains it.
SYMPTOMS_EN = {
    "first_word_late": "a user waits two seconds for the first word of the answer to a long "
    "document, then the words stream quickly",
    "memory_runs_out": "the server runs out of GPU memory at 20 long conversations, although the "
    "weights fill only half the card",
    "batch_is_free": "serving 32 users at once makes each user's stream only a little slower "
    "than serving one",
    "needs_nvlink": "a model too big for one GPU has the matrices of every layer split across 8 "
    "GPUs, and is fast only when they are linked by NVLink",
    "chinese_costs_more": "the same question costs more in Chinese than in English at a price "
    "per token",
}
SYMPTOMS_ZH = {
    "first_word_late": "用户对一篇长文档提问，要等两秒才看到回答的第一个词，之后的词很快地流出来",
    "memory_runs_out": "服务器在 20 个长对话时就耗尽了 GPU 显存，而权重只占了半张卡",
    "batch_is_free": "同时服务 32 个用户，每个用户的输出流只比服务一个用户时慢一点点",
    "needs_nvlink": "一个一块 GPU 装不下的模型，把每一层的矩阵切到 8 块 GPU 上，只有用 NVLink 相连时才快",
    "chinese_costs_more": "按 token 计价时，同一个问题用中文问比用英文问更贵",
}
# shown in the language in use; the keys are what the student answers with
SYMPTOMS = Bilingual(SYMPTOMS_EN, SYMPTOMS_ZH)
CHAPTER_CHOICES = tuple(f"{n:02d}" for n in range(1, 13))
# Every defensible chapter for each symptom.
_SYMPTOM_CHAPTERS = {
    "first_word_late": frozenset({"05", "10"}),
    "memory_runs_out": frozenset({"04", "11"}),
    "batch_is_free": frozenset({"07", "08"}),
    "needs_nvlink": frozenset({"09"}),
    "chinese_costs_more": frozenset({"01"}),
}
# (English, Chinese) hint per symptom, resolved with tr when shown.
_SYMPTOM_HINTS = {
    "first_word_late": (
        "the first word and the later words come from two different phases of a "
        "request; find the chapter that separates them.",
        "第一个词和后面的词出自一个请求的两个不同阶段；找到把这两个阶段分开讲的那一章。",
    ),
    "memory_runs_out": (
        "the weights are not what grows with each conversation; find what does.",
        "随每个对话一起增长的不是权重；找出是什么在增长。",
    ),
    "batch_is_free": (
        "ask what a decode step spends its time on, and whether 32 users make that "
        "part 32 times longer.",
        "想一想 decode 的一步把时间花在了哪里，32 个用户会不会让这部分变长 32 倍。",
    ),
    "needs_nvlink": (
        "splitting each layer across GPUs means they talk inside every layer: which "
        "chapter counts that communication?",
        "把每一层切到多块 GPU 上，它们在每一层里都要通信：哪一章算了这笔通信账？",
    ),
    "chinese_costs_more": (
        "a price per token depends on how many tokens a text becomes.",
        "按 token 计价时，价格取决于一段文字会变成多少个 token。",
    ),
}


def _chapter_label(value: Any) -> Any:
    """5, "5" and "05" all name chapter 05."""
    text = str(value).strip()
    return f"{int(text):02d}" if text.isdigit() else value


def symptom_to_chapter(answer: Any) -> CheckResult:
    """A dict: each key of SYMPTOMS → the chapter ("01" … "12") whose idea explains it."""
    if isinstance(answer, dict):
        answer = {k: _chapter_label(v) for k, v in answer.items()}
    return check_matching(
        "ch00.symptom_to_chapter",
        answer,
        dict(_SYMPTOM_CHAPTERS),
        choices=CHAPTER_CHOICES,
        hints={k: tr(*v) for k, v in _SYMPTOM_HINTS.items()},
        success=tr(
            "correct: each of these symptoms has its own chapter.", "正确：这些症状各有一章来解释。"
        ),
    )


EXERCISES: dict[str, ExerciseInfo] = {
    "throughput_vs_wait": ExerciseInfo(
        "reasoning",
        mistakes=(
            "a faster memory taken for a trade-off",
            "the KV cache taken for a trade-off",
            "a smaller model taken for a trade-off",
        ),
    ),
    "number_kinds": ExerciseInfo(
        "reasoning",
        mistakes=(
            "a configuration number measured",
            "a tokenizer count taken for a machine's",
            "a GPU figure thought measurable here",
        ),
    ),
    "dominant_step": ExerciseInfo(
        "reasoning",
        mistakes=(
            "phases weighed by token count",
            "weights read once per request, not per forward",
        ),
    ),
    "symptom_to_chapter": ExerciseInfo(
        "reasoning",
        mistakes=(
            "TTFT taken for a decode problem",
            "KV growth taken for weight size",
            "batching cost taken as linear",
        ),
    ),
}


# ----------------------------------------------------------------------------- the grader's fixtures

# Three checkers no chapter asks any more (the chapter count, a module's name, the fast mode: course
# trivia, not ideas). The grader's own tests keep using them: together they take a number, a letter
# and a module, the three shapes of answer a grader has to carry out of a kernel.


def num_chapters(answer) -> CheckResult:
    """How many notebooks make up the series, counting this one?"""
    return check_number(
        "ch00.num_chapters",
        answer,
        CHAPTERS,
        mistakes=[
            (
                CHAPTERS - 1,
                tr("close: did you count chapter 00 itself?", "差一点：第 00 章本身算进去了吗？"),
            ),
            (
                11,
                tr(
                    "the source chapter's flowchart has 11 steps, but the series adds a setup chapter and a review chapter.",
                    "原章节的流程图有 11 步，但本系列另加了一章准备环境、一章总复习。",
                ),
            ),
        ],
        default_hint=tr(
            "count the boxes of the map, then the chapter you are reading.",
            "先数地图上的方框，再加上你正在读的这一章。",
        ),
        rel=0,
    )


def module_for_paged_attention(answer) -> CheckResult:
    """Which llmlab module holds the paged-attention kernels (the `backend=` switch)?"""
    import llmlab.ops as target

    name = "ch00.module_for_paged_attention"
    if answer is None:
        return report(not_yet(name, NOT_ANSWERED))
    text = str(getattr(answer, "__name__", answer)).strip().lower()
    if text in (target.__name__, target.__name__.rsplit(".", 1)[-1]):
        return report(passed(name))
    if "kvcache" in text:
        return report(
            not_yet(
                name,
                tr(
                    "kvcache decides *where* blocks go; the kernels that read them live elsewhere.",
                    "kvcache 决定块放*在哪里*；读这些块的 kernel 在别处。",
                ),
            )
        )
    if "engine" in text:
        return report(
            not_yet(
                name,
                tr(
                    "the engine schedules and calls the model; look one level lower, at the ops the attention layer calls.",
                    "engine 负责调度、调用模型；再往下看一层，看注意力层调用的那些算子。",
                ),
            )
        )
    return report(
        not_yet(
            name,
            tr(
                "that is not one of the three modules that back chapter 11 in the table above.",
                "这不是上表中支撑第 11 章的三个模块之一。",
            ),
        )
    )


# Shown in this order in the notebook; the right one is marked True.
FAST_MODE_OPTIONS = (
    ("skips the figures", False),
    ("shrinks workloads (fewer requests, shorter sweeps) but keeps every figure and check", True),
    ("switches to a smaller model", False),
    ("turns the self-checks off", False),
)


def fast_mode(answer) -> CheckResult:
    """What does LLMLAB_FAST=1 do? One letter of FAST_MODE_OPTIONS."""
    letters, right = _lettered(FAST_MODE_OPTIONS)
    return check_choice(
        "ch00.fast_mode",
        answer,
        right,
        options=letters,
        hints={
            letters[0]: tr(
                "no: every figure is still drawn, headless runs included.",
                "不对：每张图照样会画，没有界面的运行也一样。",
            ),
            letters[2]: tr(
                "no: the model is the same SmolLM2 in both modes.",
                "不对：两种模式用的都是同一个 SmolLM2。",
            ),
            letters[3]: tr(
                "no: the tests run in fast mode precisely to run every check.",
                "不对：测试用快速模式运行，恰恰是为了跑遍每一个自测。",
            ),
        },
    )
