from common.request import SamplingParams
from talker.models.qwen3_tts.prompt import PromptIds
from talker.scheduler import Scheduler, Seq, SeqStatus, StepPlan, TextFeed


def _seq(i: int, max_frames: int = 10) -> Seq:
    return Seq(f"r{i}", PromptIds((1, 2, 3), None, (9,)), SamplingParams(), i, max_frames, None)


def _step(s: Scheduler, step: int) -> StepPlan:
    plan = s.schedule()
    for seq in plan.prefill:
        seq.prefill_len = 5
    s.commit(plan, step)
    s.expire(step)
    return plan


def test_admission_respects_slots_and_prefill_limit() -> None:
    s = Scheduler(max_batch=3, max_prefills=2, max_len=100)
    seqs = [_seq(i) for i in range(5)]
    for q in seqs:
        s.add(q)
    plan = s.schedule()
    assert [q.request_id for q in plan.prefill] == ["r0", "r1"]
    s.commit(plan, 0)
    plan = s.schedule()
    assert [q.request_id for q in plan.batch] == ["r2"]  # a prefill step of its own: r0 and r1 sit it out
    assert plan.decode == [] and [q.join_step for q in seqs[:2]] == [1, 1]
    s.commit(plan, 1)
    assert s.active == 3 and len(s.waiting) == 2 and not s.free_slots
    assert s.schedule().prefill == []


def test_finish_frees_the_slot_and_waiting_requests_take_it() -> None:
    s = Scheduler(max_batch=1, max_prefills=4, max_len=100)
    a, b = _seq(0), _seq(1)
    s.add(a)
    s.add(b)
    _step(s, 0)
    assert s.finish(a) and not s.finish(a)
    assert a.status is SeqStatus.DONE and s.free_slots == [a.slot]
    plan = s.schedule()
    assert plan.prefill == [b]


def test_frame_limit_expires_without_per_step_work() -> None:
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    q = _seq(0, max_frames=3)
    s.add(q)
    for step in range(3):
        _step(s, step)
    assert q.status is SeqStatus.DONE and not s.has_work()


def test_pause_keeps_the_slot_and_shifts_the_deadline() -> None:
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    q = _seq(0, max_frames=4)
    s.add(q)
    _step(s, 0)
    s.set_paused(q, True, 1)
    assert not s.has_work() and s.active == 1
    s.set_paused(q, False, 10)
    for step in range(10, 13):
        assert q.status is SeqStatus.RUNNING
        _step(s, step)
    assert q.status is SeqStatus.DONE
    assert q.frames_after(12) == 4


def test_kv_offset_gives_each_rows_length() -> None:
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    q = _seq(0)
    s.add(q)
    _step(s, 0)
    plan = s.schedule()
    assert plan.kv_offset + 1 == 5 + 1  # decode at step 1 writes position 5 of a 5-token prompt


def _long_seq(i: int, text_tokens: int) -> Seq:
    return Seq(f"r{i}", PromptIds(tuple(range(text_tokens)), None, (9,)), SamplingParams(), i, 10, None)


def test_a_prefill_token_budget_bounds_the_padded_prefill() -> None:
    s = Scheduler(max_batch=8, max_prefills=8, max_len=4096, max_prefill_tokens=100)
    for i, n in enumerate((19, 19, 29, 9, 9)):  # token bounds 20, 20, 30, 10, 10
        s.add(_long_seq(i, n))
    plan = s.schedule()
    assert [q.request_id for q in plan.prefill] == ["r0", "r1", "r2"]  # 3 x 30 = 90; a 4th would pad to 120
    s.commit(plan, 0)
    assert [q.request_id for q in s.schedule().prefill] == ["r3", "r4"]


def test_one_prompt_over_the_budget_is_still_admitted_alone() -> None:
    s = Scheduler(max_batch=4, max_prefills=4, max_len=4096, max_prefill_tokens=16)
    s.add(_long_seq(0, 99))
    s.add(_long_seq(1, 3))
    assert [q.request_id for q in s.schedule().prefill] == ["r0"]


def test_a_prefill_alone_step_is_sat_out_by_the_running_rows_without_losing_a_frame() -> None:
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    a, b = _seq(0, max_frames=4), _seq(1)
    s.add(a)
    _step(s, 0)
    s.add(b)
    plan = s.schedule()
    assert plan.batch == (b,) and plan.decode == []  # a sits out step 1
    for seq in plan.prefill:
        seq.prefill_len = 5
    s.commit(plan, 1)
    s.expire(1)
    plan = s.schedule()
    assert plan.batch == (a, b)
    assert plan.kv_offset + 2 == 5 + 1  # a's KV still ends at position 5 at step 2: it gained no frame at step 1
    for step in range(2, 5):
        assert a.status is SeqStatus.RUNNING
        _step(s, step)
    assert a.status is SeqStatus.DONE and a.frames_after(4) == 4  # frames at steps 0, 2, 3 and 4


def test_an_aside_prefill_joins_at_the_step_in_flight_and_moves_no_running_row() -> None:
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    a, b = _seq(0, max_frames=4), _seq(1, max_frames=2)
    s.add(a)
    _step(s, 0)
    outer = s.schedule()  # step 1 in flight: a decodes
    assert s.schedule_aside() is None  # nobody waits
    s.add(b)
    aside = s.schedule_aside()
    assert aside is not None and aside.batch == (b,) and aside.decode == [] and b.slot != a.slot
    b.prefill_len = 7
    s.commit(aside, 1)
    s.advance(outer, 1)
    plan = s.schedule()
    assert plan.batch == (a, b)
    assert a.frames_after(2) == 3 and b.frames_after(2) == 2  # a: steps 0, 1, 2; b: its aside at 1, then 2
    assert plan.kv_offset + 2 == 7 + 1  # b's KV ends at position 7 + 1 at step 2
    s.advance(plan, 2)
    assert b.status is SeqStatus.DONE and a.status is SeqStatus.RUNNING
    s.advance(s.schedule(), 3)
    assert a.status is SeqStatus.DONE


def test_a_pause_that_meets_a_waiting_seq_takes_effect_when_it_joins() -> None:
    """A long text's next segment may still wait for a slot when its reader falls behind: the pause holds."""
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    q, r = _seq(0), _seq(1)
    s.add(q)
    s.set_paused(q, True, 0)
    s.add(r)
    s.set_paused(r, True, 0)
    s.set_paused(r, False, 0)  # and a resume before it joins cancels it
    _step(s, 0)
    assert q.status is SeqStatus.PAUSED and r.status is SeqStatus.RUNNING
    assert [x.request_id for x in s.schedule().batch] == ["r1"]


def test_a_later_segment_goes_before_newer_requests() -> None:
    s = Scheduler(max_batch=1, max_prefills=1, max_len=100)
    newer, segment = _seq(0), _seq(1)
    segment.segment = 1
    s.add(newer)
    s.add(segment)
    assert s.schedule().prefill == [segment]


def _fed(i: int, tokens: int, max_frames: int = 50) -> Seq:
    seq = _seq(i, max_frames)
    seq.feed = TextFeed(list(range(100, 100 + tokens)))
    return seq


def _steps_of(s: Scheduler, seq: Seq, steps: range) -> list[int]:
    """The steps among `steps` that stepped `seq` (or prefilled it)."""
    return [step for step in steps if seq in _step(s, step).batch]


def test_a_streaming_text_waits_where_it_runs_out_and_resumes_where_it_stopped() -> None:
    s = Scheduler(max_batch=2, max_prefills=2, max_len=100)
    q = _fed(0, tokens=2)  # frame 0 from the prompt's token, frames 1 and 2 from these two
    s.add(q)
    assert _steps_of(s, q, range(6)) == [0, 1, 2]
    assert q.starved and q.status is SeqStatus.PAUSED and s.starved == [q] and s.active == 1 and not s.has_work()
    s.starved.clear()
    assert q.feed is not None
    q.feed.tokens += [103, 104]
    s.fed(q, 6)
    assert _steps_of(s, q, range(6, 12)) == [6, 7]  # frames 3 and 4, then it waits again
    assert q.frames_after(7) == 5 and q.starved
    q.feed.done = True  # the end: its limit is the frame cap again
    s.fed(q, 20)
    assert q.status is SeqStatus.RUNNING and q.deadline == 20 + 50 - 5 - 1
    s.finish(q)
    assert sorted(s.free_slots) == [0, 1] and not s.running


def test_text_that_comes_before_it_runs_out_moves_its_deadline() -> None:
    s = Scheduler(max_batch=1, max_prefills=1, max_len=100)
    q = _fed(0, tokens=1)
    s.add(q)
    _step(s, 0)
    assert q.feed is not None
    q.feed.tokens.append(200)
    s.fed(q, 1)
    assert _steps_of(s, q, range(1, 5)) == [1, 2] and q.starved


def test_a_reader_pause_and_a_text_wait_hold_it_until_both_end() -> None:
    s = Scheduler(max_batch=1, max_prefills=1, max_len=100)
    q = _fed(0, tokens=0)  # it waits right after its prefill
    s.add(q)
    _step(s, 0)
    assert q.starved
    s.set_paused(q, True, 1)
    assert q.feed is not None
    q.feed.tokens.append(7)
    s.fed(q, 2)
    assert q.status is SeqStatus.PAUSED and not s.has_work()  # its reader is still behind
    s.set_paused(q, False, 4)
    assert _steps_of(s, q, range(4, 8)) == [4] and q.frames_after(4) == 2


def test_a_pause_on_join_counts_the_frame_it_made() -> None:
    """Paused before its prefill: the prefill made frame 0, so the step it resumes at makes frame 1."""
    s = Scheduler(max_batch=1, max_prefills=1, max_len=100)
    q = _fed(0, tokens=1)
    s.add(q)
    s.set_paused(q, True, 0)
    _step(s, 0)
    s.set_paused(q, False, 5)
    assert _steps_of(s, q, range(5, 9)) == [5] and q.frames_after(5) == 2 and q.starved


def test_a_starved_seq_gives_its_slot_only_to_queued_work_and_comes_back_where_it_stopped() -> None:
    s = Scheduler(max_batch=1, max_prefills=1, max_len=100)
    q = _fed(0, tokens=1)
    s.add(q)
    assert _steps_of(s, q, range(4)) == [0, 1] and q.starved
    assert not s.reslot_due() and not s.has_work()  # nobody wants its slot: it keeps it
    other = _seq(1, max_frames=2)
    s.add(other)
    assert s.reslot_due() and s.has_work() and s.to_park() == [q]
    assert q.held_kv_len == 5 + 2 - 1  # its prompt, and frame 1's position (frame 0 came from the prefill)
    slot = q.slot
    s.park(q)
    assert q.status is SeqStatus.PARKED and q.slot == -1 and s.free_slots == [slot] and s.active == 0
    assert not s.reslot_due() and _steps_of(s, other, range(4, 6)) == [4, 5]  # it is served meanwhile
    assert q.feed is not None
    q.feed.tokens.append(101)
    s.fed(q, 6)
    s.fed(q, 6)  # more text while it waits for a slot: queued once
    assert list(s.resuming) == [q] and s.reslot_due()
    late = _seq(2)
    s.add(late)  # a new request: the resumed one goes first
    assert s.resume(8) == [q] and q.status is SeqStatus.RUNNING and q.slot == slot and not s.free_slots
    assert s.to_park() == [] and _steps_of(s, q, range(8, 10)) == [8]  # frame 2, then it waits again
    assert q.frames_after(8) == 3 and q.starved and s.to_park() == [q]  # and `late` wants its slot


def test_a_parked_seq_ends_cleanly_and_a_reader_pause_holds_it_after_it_resumes() -> None:
    s = Scheduler(max_batch=1, max_prefills=1, max_len=100)
    q, r, x = _fed(0, tokens=0), _fed(1, tokens=0), _seq(2)  # the fed ones wait right after their prefill
    s.add(q)
    _step(s, 0)
    s.add(r)
    s.add(x)
    assert s.to_park() == [q]
    s.park(q)
    _step(s, 1)
    assert r.starved and s.to_park() == [r]
    s.park(r)
    _step(s, 2)
    assert s.running == [x] and s.finish(q) and q not in s.parked and s.finish(q) is False  # no text came
    s.set_paused(r, True, 3)  # its reader falls behind while it is parked
    assert r.feed is not None
    r.feed.tokens.append(7)
    s.fed(r, 3)
    assert s.finish(x) and s.resume(4) == [r] and r.status is SeqStatus.PAUSED  # it holds the slot, not stepped
    s.set_paused(r, False, 6)
    assert _steps_of(s, r, range(6, 9)) == [6] and r.frames_after(6) == 2 and r.starved
    assert list(s.hungry) == [r] and not s.parked and not s.resuming and s.all_seqs() == [r]
