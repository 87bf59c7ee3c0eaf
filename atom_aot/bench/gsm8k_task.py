"""GSM8K as lm-eval's `gsm8k` task scores it: "Question: ...\\nAnswer:" few-shot prompts, greedy
generation, and exact match on the final number after its two filters:

- strict-match: the number after "#### " (the format the few-shot answers teach);
- flexible-extract: the last number-looking string in the completion.

Both sides then drop ",", "$", a trailing "." and anything up to "#### ", case-insensitively.
lm-eval takes few-shot examples from the train split; only the test split is here, so they come
from the END of the file and never overlap the first problems evaluated.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

STOP = ["Question:", "</s>", "<|im_end|>", "\n\n"]     # lm-eval's, plus the blank line that ends an answer
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = [",", r"\$", r"(?s).*#### ", r"\.$"]
INVALID = "[invalid]"


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str          # the worked solution, ending "#### N"

    @property
    def target(self) -> str:
        return normalize(self.answer)


def load_problems(path: str) -> list[Problem]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Problem(row["question"], row["answer"]) for row in rows]


def split(problems: list[Problem], num_shots: int, limit: int | None) -> tuple[list[Problem], list[Problem]]:
    """(few-shot examples from the end, problems to evaluate from the start); never overlapping."""
    shots = problems[len(problems) - num_shots:] if num_shots else []
    pool = problems[:len(problems) - num_shots]
    return shots, pool[:limit] if limit is not None else pool


def prompt(problem: Problem, shots: list[Problem]) -> str:
    examples = [f"Question: {s.question}\nAnswer: {s.answer}" for s in shots]
    return "\n\n".join(examples + [f"Question: {problem.question}\nAnswer:"])


def cut_at_stop(text: str, stop: list[str] = STOP) -> str:
    """The completion up to its first stop string (what a server with `stop` returns)."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


def extract_strict(completion: str) -> str:
    match = STRICT.search(completion)
    return match.group(1).strip() if match else INVALID


def extract_flexible(completion: str) -> str:
    matches = FLEXIBLE.findall(completion)
    if not matches:
        return INVALID
    return next(group for group in matches[-1] if group).strip()


def normalize(text: str) -> str:
    for pattern in IGNORED:
        text = re.sub(pattern, "", text)
    return text.lower()


def score(problem: Problem, completion: str) -> dict:
    """Per-problem record: the completion, both extractions and whether each matches."""
    strict, flexible = extract_strict(completion), extract_flexible(completion)
    return {"completion": completion, "target": problem.target, "strict": strict, "flexible": flexible,
            "strict_correct": normalize(strict) == problem.target,
            "flexible_correct": normalize(flexible) == problem.target}


def accuracy(records: list[dict]) -> dict:
    n = len(records)
    return {"n": n, "strict-match": sum(r["strict_correct"] for r in records) / n if n else 0.0,
            "flexible-extract": sum(r["flexible_correct"] for r in records) / n if n else 0.0}
