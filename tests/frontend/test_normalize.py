"""Numbers and symbols read out in each language the checkpoints speak: money, percentages, times, dates, ordinals,
units, decimals and thousands, as a reader would say them (the words are num2words' and WeTextProcessing's); a text
normalised is normalised (sending the transcript back changes nothing); a language without rules is left alone."""

from __future__ import annotations

import pytest

from frontend.normalize import LANGUAGES, TextNormalizer

NORMALIZER = TextNormalizer()
CASES = [
    # the README's cases
    ("english", "$3.50", "three dollars fifty cents"),
    ("english", "12/05/2026", "December fifth, twenty twenty-six"),
    ("english", "7:30 pm", "seven thirty p m"),
    ("english", "42%", "forty-two percent"),
    ("english", "1,200", "one thousand two hundred"),
    ("english", "60 km/h", "sixty kilometers per hour"),
    # English
    ("english", "It costs €20, or £1.", "It costs twenty euro, or one pound sterling."),
    ("english", "Meet at 7:00 or 10:05am.", "Meet at seven o'clock or ten oh five a m."),
    ("english", "On 2024-05-03 it was -3.5 °C.",
     "On May third, twenty twenty-four it was minus three point five degrees Celsius."),
    ("english", "the 21st time since 1999", "the twenty-first time since nineteen ninety-nine"),
    ("english", "Call 555-1234.", "Call five five five, one two three four."),
    ("english", "Dr. Smith & Mr. Jones, e.g. 2 of 3.", "Doctor Smith and Mister Jones, for example two of three."),
    ("english", "Version 2.0", "Version two point zero"),
    # the letters-written languages (decimal comma, their thousands, day before month)
    ("german", "Es kostet 3,50 € und 42 %.", "Es kostet drei Euro und fünfzig Cent und zweiundvierzig Prozent."),
    ("german", "Am 05.12.2026 um 7:30, 60 km/h", "Am fünfte Dezember zweitausendsechsundzwanzig um sieben dreißig, "
                                                 "sechzig Kilometer pro Stunde"),
    ("german", "1.200 Menschen", "eintausendzweihundert Menschen"),
    ("french", "Le 1er mai, 42 % de 1 200 personnes.", "Le premier mai, quarante-deux pour cent de mille deux cents "
                                                        "personnes."),
    ("french", "3,5 kg", "trois virgule cinq kilogrammes"),
    ("spanish", "El 5/12/2026 cuesta 20 €.", "El cinco de diciembre de dos mil veintiséis cuesta veinte euros."),
    ("italian", "Costa 3,50 €, il 42 %.", "Costa tre euro e cinquanta centesimi, il quarantadue per cento."),
    ("portuguese", "Custa 3,50 € a 60 km/h.", "Custa três euros e cinquenta cêntimos a sessenta quilômetros por hora."),
    ("russian", "1 200 человек", "одна тысяча двести человек"),
    ("korean", "₩1,200", "천이백원"),
    # WeTextProcessing
    ("chinese", "你好 WeTextProcessing 1.0，全新版本儿，简直666",
     "你好 WeTextProcessing 一点零，全新版本儿，简直六百六十六"),
    ("chinese", "价格是3.5元，42%的人", "价格是三点五元，百分之四十二的人"),
    ("chinese", "2026年12月5日", "二零二六年十二月五日"),
    ("japanese", "価格は350円です", "価格は三百五十円です"),
]


@pytest.mark.parametrize(("language", "text", "spoken"), CASES)
def test_numbers_and_symbols_are_read_out(language: str, text: str, spoken: str) -> None:
    assert NORMALIZER.normalize(text, language) == spoken
    assert NORMALIZER.normalize(spoken, language) == spoken  # the transcript, sent back, is spoken the same


def test_num2words_own_examples() -> None:
    """num2words' README: 42 in French is "quarante-deux"; as an ordinal in English, "forty-second"."""
    assert NORMALIZER.normalize("42", "french") == "quarante-deux"
    assert NORMALIZER.normalize("42nd", "english") == "forty-second"


def test_every_checkpoint_language_has_rules_and_others_are_left_alone() -> None:
    assert set(LANGUAGES) == {"chinese", "english", "japanese", "korean", "german", "french", "russian", "portuguese",
                              "spanish", "italian"}
    assert NORMALIZER.normalize("$3.50 at 7:30", None) == "$3.50 at 7:30"
    assert NORMALIZER.normalize("$3.50 at 7:30", "sichuan_dialect") == "$3.50 at 7:30"
    assert NORMALIZER.normalize("No digits, no symbols", "english") == "No digits, no symbols"
