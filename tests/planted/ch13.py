"""Chapter 13's build exercise: per-channel int8 quantization (`quantize_per_channel`)."""

from planted import Exercise, bug, notebook_definitions

SOLUTION = notebook_definitions("13-dtypes", "quantize_per_channel")
Q = "ch13:quantizer."

EXERCISES = [
    Exercise(
        "ch13.quantize_per_channel",
        "quantize_per_channel",
        SOLUTION,
        (
            bug(
                "one_scale_for_the_matrix",
                SOLUTION,
                Q + "one_scale",
                "amax = w.abs().amax(dim=1)",
                "amax = w.abs().amax().reshape(1)",
            ),
            bug(
                "scale_per_column",
                SOLUTION,
                Q + "scale_per_column",
                "amax = w.abs().amax(dim=1)",
                "amax = w.abs().amax(dim=0)",
                "torch.round(w / scale[:, None])",
                "torch.round(w / scale[None, :])",
            ),
            bug(
                "truncated_not_rounded",
                SOLUTION,
                Q + "truncated",
                "torch.round(w / scale[:, None])",
                "(w / scale[:, None])",
            ),
            bug(
                "scale_from_max_minus_min",
                SOLUTION,
                (Q + "range_unused", Q + "scale_not_amax"),
                "amax = w.abs().amax(dim=1)",
                "amax = w.amax(dim=1) - w.amin(dim=1)",
            ),
            bug(
                "zero_row_divides_by_zero",
                SOLUTION,
                Q + "scale_not_positive",
                "torch.where(amax > 0, amax / 127, torch.ones_like(amax))",
                "amax / 127",
            ),
            bug(
                "q_left_in_float",
                SOLUTION,
                Q + "q_not_int8",
                ".clamp(-127, 127).to(torch.int8)",
                ".clamp(-127, 127)",
            ),
            bug(
                "divides_in_place",
                SOLUTION,
                Q + "changed_input",
                "torch.round(w / scale[:, None])",
                "torch.round(w.div_(scale[:, None]))",
            ),
        ),
    )
]
