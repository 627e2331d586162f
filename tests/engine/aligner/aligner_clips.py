"""The clips of tests/fixtures/aligner_reference.json, made from the shared fixtures' audio (the oracle script that
wrote the file makes them the same way: scripts/oracle/make_aligner_reference.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

VOICE = "voice-ref-a.wav"  # 24 kHz, 5.2 s
TONE = "qwen3-forced-aligner-tiny-official/tone-3s.wav"  # 16 kHz, 3 s (paths under tests/fixtures/official/)

CASES: dict[str, dict[str, Any]] = {
    "chinese": {"audio": [TONE], "language": "Chinese", "text": "你好，世界！今天天气很好，我们去公园散步吧。"},
    "japanese": {"audio": [TONE], "language": "Japanese", "text": "今日はいい天気ですね。東京に行きます。"},
    "german": {"audio": [VOICE], "language": "German", "text": "Guten Morgen! Es ist zwölf Uhr, und ich heiße Anna."},
    # three copies of the 24 kHz voice: 15.7 s, over two 8 s attention windows of the encoder
    "long": {"audio": [VOICE, VOICE, VOICE], "language": "English",
             "text": "Okay. Yeah. I resent you. I love you. I respect you. " * 3},
    "mixed": {"audio": [VOICE], "language": "English",
              "text": "It costs twenty-five dollars — that's 25% off; Tschüss, señor 李先生."},
    # Korean tokens cut after their longest head on the official word list (engine/aligner/korean.py)
    "korean": {"audio": [VOICE], "language": "Korean",
               "text": "안녕하세요, 저는 학생입니다. 서울에서 부산까지 기차로 세 시간 걸립니다!"},
    "korean-mixed": {"audio": [TONE], "language": "Korean",
                     "text": "대한민국의 수도는 서울이고, 2024년에 韓國語 공부를 시작했어요."},
}

# texts whose official Korean words (no audio) the reference also holds
KOREAN_TEXTS = [
    "프로그래밍 언어를 배우는 것은 재미있습니다",
    "오늘 날씨가 정말 좋네요.",
    "가 나 다라 마바사 아자차카타파하",
    "“인공지능(AI)”은... 우리의 미래-사회를 바꿀 것입니다?!",
    "  여러분,\t감사합니다\n",
]


def clip(spec: dict[str, Any], read: Callable[[Path], tuple[np.ndarray, int]], shared: Path) -> tuple[np.ndarray, int]:
    """The case's int16 samples (its audio files one after another) and their rate."""
    parts = [read(shared / name) for name in spec["audio"]]
    rates = {rate for _, rate in parts}
    assert len(rates) == 1, "a clip's files share one rate"
    return np.concatenate([pcm for pcm, _ in parts]), rates.pop()
