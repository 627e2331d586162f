"""The codec's one decode routine (shared by the child process and the in-process path), and the process."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios
import threading
import time
from collections import OrderedDict
from multiprocessing.connection import Connection, wait
from pathlib import Path

import numpy as np
import pytest
import torch

from output_builder.codec_process import CodecProcess, DecodeRequest, decode_batch
from output_builder.codecs import CodecConfig, Qwen12HzCodec


def test_codes_outside_the_codebook_fail_the_call_before_they_reach_the_device() -> None:
    codec = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11)
    states: dict[int, object] = {}
    good = np.zeros((16, 2), dtype=np.int64)
    assert [p.shape for p in decode_batch(codec, states, DecodeRequest([(1, good)]))] == [
        (2 * codec.samples_per_frame,)]
    bad = good.copy()
    bad[0, 1] = codec.config.codebook_size  # e.g. a special token of the Talker's codebook 0
    with pytest.raises(ValueError, match="outside the codebook"):
        decode_batch(codec, states, DecodeRequest([(1, good), (2, bad)], closed=[2]))
    assert 2 not in states
    assert len(decode_batch(codec, states, DecodeRequest([(1, good)]))) == 1  # the stream goes on


def unread(conn: Connection) -> int:
    """Bytes sent on `conn` that its peer has not read yet (SIOCOUTQ of a Unix socket)."""
    return int(struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0])


@pytest.mark.bitexact
def test_the_codec_process_decodes_a_first_chunk_in_the_middle_of_a_backlog_call(tmp_path: Path) -> None:
    """Ordered by events, not time: the child is stopped (SIGSTOP) as soon as it has read a backlog call, the
    urgent call is sent while the backlog call is caught in flight, and the urgent answer must come first."""
    Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11).save_pretrained(tmp_path)
    codec = Qwen12HzCodec.from_pretrained(tmp_path)  # as the process loads it
    rng = np.random.default_rng(0)
    backlog = [(sid, rng.integers(0, 2048, (16, 8))) for sid in range(48)]  # a call of 384 frames, ~15 stages
    first = [(100, rng.integers(0, 2048, (16, 1)))]
    # with the child's one thread: with AVX2 kernels the codec's bits depend on the intra-op thread count
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want_backlog = decode_batch(codec, {}, DecodeRequest(backlog))
        want_first = decode_batch(codec, {}, DecodeRequest(first))
    finally:
        torch.set_num_threads(threads)
    process = CodecProcess(tmp_path, "cpu", 1)
    lanes = process._conn, process._urgent  # the lanes' pipes, used directly so that the test decides when
    try:
        lanes[0].send(DecodeRequest(backlog))
        deadline = time.monotonic() + 30  # a failure timeout only: spins until the child has read the request
        while unread(lanes[0]):
            assert time.monotonic() < deadline, "the codec process never read the backlog call"
        os.kill(process.pid, signal.SIGSTOP)  # at the start of the call: its stages are all ahead
        try:
            assert not lanes[0].poll(), "the backlog call was over before the child could be stopped in it"
            lanes[1].send(DecodeRequest(first))
        finally:
            os.kill(process.pid, signal.SIGCONT)
        ready = wait(list(lanes), timeout=60)
        assert ready == [lanes[1]], "the first chunk waited for the whole backlog call"
        (status, got_first), (status_backlog, got_backlog) = lanes[1].recv(), lanes[0].recv()
        assert status == status_backlog == "ok"
        assert all(np.array_equal(g, w) for g, w in zip(got_backlog, want_backlog, strict=True))
        assert np.array_equal(got_first[0], want_first[0])
        assert len(process.decode([(100, first[0][1])], urgent=False)) == 1  # the stream goes on in the backlog
    finally:
        process.stop()


def test_the_codec_process_ends_when_its_parent_goes(tmp_path: Path) -> None:
    Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11).save_pretrained(tmp_path)
    process = CodecProcess(tmp_path, "cpu", 1)
    process._conn.close()  # as a parent that died would leave both pipes
    process._urgent.close()
    try:
        process._proc.wait(10)
    finally:
        process._proc.kill()
    assert process._proc.returncode == 0


def test_a_first_chunk_that_comes_after_its_streams_close_leaves_no_state() -> None:
    codec = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11)
    states: dict[int, object] = {}
    gone: OrderedDict[int, None] = OrderedDict()
    codes = np.zeros((16, 1), dtype=np.int64)
    decode_batch(codec, states, DecodeRequest([(1, codes)], closed=[2]), gone)  # 2 was cancelled before its call
    assert list(states) == [1] and list(gone) == [2]
    assert len(decode_batch(codec, states, DecodeRequest([(2, codes)]), gone)) == 1  # its late first chunk
    assert list(states) == [1] and not gone
    decode_batch(codec, states, DecodeRequest([(1, codes)], closed=[1]), gone)  # last job and close together
    assert not states and not gone


def test_the_codec_process_outlives_the_thread_that_created_it(tmp_path: Path) -> None:
    # It dies with its parent by PR_SET_PDEATHSIG, which the kernel sends when the *thread* that forked it exits.
    # The engine creates it on an executor thread (asyncio.to_thread), which can exit before the engine stops.
    Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11).save_pretrained(tmp_path)
    made: list[CodecProcess] = []
    creator = threading.Thread(target=lambda: made.append(CodecProcess(tmp_path, "cpu", 1)))
    creator.start()
    creator.join(120)  # the thread is gone: a signal tied to it has been sent by now
    [process] = made
    try:  # a SIGKILLed child could not answer (the signal is taken before it runs again)
        assert len(process.decode([(1, np.zeros((16, 1), dtype=np.int64))])) == 1
    finally:
        process.stop()
