"""Draft-model proposer: a second, smaller artifact with the served model's tokenizer guesses the
next K tokens greedily, run through the runtime's own pieces (block manager, model runner, sampler)
on a KV cache of its own.

Each running target sequence has a shadow sequence in the draft's cache. Before proposing, the
shadow takes the target's known tokens; the draft's KV stays valid up to the first token where
they differ (its rejected guesses), and the rest is recomputed in one step, which also guesses
the first draft token; K-1 one-token steps guess the others. Shadows of sequences that finished
or were preempted are freed at the next proposal.
"""
from __future__ import annotations

from atom_aot.runtime.execution.model_runner import ModelRunner
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.block_manager import BlockManager
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.sequence import Sequence, SequenceStatus

GREEDY = SamplingParams(temperature=0, max_tokens=None)


class DraftModelProposer:
    decodes_without_drafts = True       # its shadows catch up from token ids (runtime/spec/proposer.py)
    lookahead_slots = 0                 # its KV lives in a pool of its own

    def __init__(self, runner: ModelRunner, block_manager: BlockManager, num_speculative_tokens: int):
        self.runner = runner
        self.block_manager = block_manager
        self.num_speculative_tokens = num_speculative_tokens
        self._shadows: dict[Sequence, Sequence] = {}     # target sequence -> its copy in the draft's cache
        self._freed: list[Sequence] = []                 # shadows freed since the draft's last step

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[list[int]]:
        self._drop_gone()
        wanted = {self._catch_up(seq): min(self.num_speculative_tokens, limit)
                  for seq, limit in zip(seqs, limits) if limit > 0}
        drafts: dict[Sequence, list[int]] = {shadow: [] for shadow in wanted}
        active = list(wanted)
        counts = [shadow.num_uncomputed_tokens for shadow in active]   # the first step catches up
        while active:
            for shadow, token in zip(active, self._step(active, counts)):
                shadow.token_ids.append(token)
                drafts[shadow].append(token)
            active = [shadow for shadow in active if len(drafts[shadow]) < wanted[shadow]]
            counts = [1] * len(active)
        return [drafts.get(self._shadows.get(seq), []) if limit > 0 else [] for seq, limit in zip(seqs, limits)]

    def _catch_up(self, seq: Sequence) -> Sequence:
        """The target's shadow, holding the target's known tokens; its computed count cut to the
        tokens both agree on (at least one is left to compute: the step that follows samples)."""
        shadow = self._shadows.get(seq)
        if shadow is None:
            shadow = self._shadows[seq] = Sequence(request_id=seq.request_id, token_ids=[], num_prompt_tokens=0,
                                                   params=GREEDY, block_size=self.block_manager.block_size,
                                                   status=SequenceStatus.RUNNING)
        agreed = next((i for i, (a, b) in enumerate(zip(shadow.token_ids, seq.token_ids)) if a != b),
                      min(len(shadow.token_ids), len(seq.token_ids)))
        shadow.token_ids = list(seq.token_ids)
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, agreed, len(seq.token_ids) - 1)
        return shadow

    def _step(self, shadows: list[Sequence], counts: list[int]) -> list[int]:
        """Compute `counts` more tokens of each shadow and return the draft's greedy next tokens."""
        for shadow, count in zip(shadows, counts):
            if not self.block_manager.can_allocate(shadow, count):
                raise RuntimeError(f"the draft model's KV cache is full ({self.block_manager.num_blocks} blocks); it "
                                   f"is sized to hold every token the target's holds, so this is a bug")
            self.block_manager.allocate(shadow, count)
        batch = ScheduledBatch.of(tuple(shadows), tuple(counts), is_prefill=any(c > 1 for c in counts),
                                  freed=tuple(self._freed))
        self._freed.clear()
        for shadow, count in zip(shadows, counts):
            shadow.num_computed_tokens += count
        return self.runner.run(batch).sampled

    def _drop_gone(self) -> None:
        """Free the shadows of sequences that finished or were preempted (a preempted one starts over)."""
        for seq in [seq for seq in self._shadows if seq.status != SequenceStatus.RUNNING]:
            shadow = self._shadows.pop(seq)
            self.block_manager.free(shadow)
            self._freed.append(shadow)
