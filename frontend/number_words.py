"""Numbers and symbols as words, for the checkpoint languages written in letters (English, German, French, Spanish,
Italian, Portuguese, Russian) and Korean: money, percentages, times, dates, ordinals, units, decimals and numbers with
thousands separators, the words from num2words in each language; the phrases around them (a currency's place, "per
cent", a month's name) from the small tables here. Chinese and Japanese go through WeTextProcessing instead
(frontend/normalize.py).

Each rule is one named group of one regular expression, so a text is read once, left to right, and a span that a
rule took (a date) is not read again by a later one (its numbers).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from num2words import CONVERTER_CLASSES, num2words

CURRENCIES = {"$": "USD", "€": "EUR", "£": "GBP", "₩": "KRW", "USD": "USD", "EUR": "EUR", "GBP": "GBP"}
MONTHS = {
    "english": "January February March April May June July August September October November December",
    "german": "Januar Februar März April Mai Juni Juli August September Oktober November Dezember",
    "french": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
    "spanish": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre",
    "italian": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre dicembre",
    "portuguese": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro dezembro",
}
PERCENT = {"english": "percent", "german": "Prozent", "french": "pour cent", "spanish": "por ciento",
           "italian": "per cento", "portuguese": "por cento", "russian": "процентов", "korean": "퍼센트"}
UNITS = {  # symbol → (singular, plural)
    "english": {"km/h": ("kilometer per hour", "kilometers per hour"), "mph": ("mile per hour", "miles per hour"),
                "km": ("kilometer", "kilometers"), "kg": ("kilogram", "kilograms"), "cm": ("centimeter", "centimeters"),
                "mm": ("millimeter", "millimeters"), "ml": ("milliliter", "milliliters"), "m": ("meter", "meters"),
                "g": ("gram", "grams"), "°C": ("degree Celsius", "degrees Celsius"),
                "°F": ("degree Fahrenheit", "degrees Fahrenheit")},
    "german": {"km/h": ("Kilometer pro Stunde",) * 2, "km": ("Kilometer",) * 2, "kg": ("Kilogramm",) * 2,
               "cm": ("Zentimeter",) * 2, "m": ("Meter",) * 2, "°C": ("Grad Celsius",) * 2},
    "french": {"km/h": ("kilomètre par heure", "kilomètres par heure"), "km": ("kilomètre", "kilomètres"),
               "kg": ("kilogramme", "kilogrammes"), "cm": ("centimètre", "centimètres"), "m": ("mètre", "mètres"),
               "°C": ("degré Celsius", "degrés Celsius")},
    "spanish": {"km/h": ("kilómetro por hora", "kilómetros por hora"), "km": ("kilómetro", "kilómetros"),
                "kg": ("kilogramo", "kilogramos"), "cm": ("centímetro", "centímetros"), "m": ("metro", "metros"),
                "°C": ("grado Celsius", "grados Celsius")},
    "italian": {"km/h": ("chilometro orario", "chilometri orari"), "km": ("chilometro", "chilometri"),
                "kg": ("chilogrammo", "chilogrammi"), "cm": ("centimetro", "centimetri"), "m": ("metro", "metri"),
                "°C": ("grado Celsius", "gradi Celsius")},
    "portuguese": {"km/h": ("quilômetro por hora", "quilômetros por hora"), "km": ("quilômetro", "quilômetros"),
                   "kg": ("quilograma", "quilogramas"), "cm": ("centímetro", "centímetros"), "m": ("metro", "metros"),
                   "°C": ("grau Celsius", "graus Celsius")},
}
ENGLISH_WORDS = {"Dr.": "Doctor", "Mr.": "Mister", "Mrs.": "Missus", "Ms.": "Miz", "Prof.": "Professor",
                 "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera", "vs.": "versus", "&": "and"}
ORDINAL_SUFFIXES = {"english": "st|nd|rd|th", "french": "er|re|ème|e", "spanish": "º|ª|°", "italian": "º|ª|°",
                    "portuguese": "º|ª|°"}
YEAR_CUES = "[Ii]n|[Ss]ince|[Bb]y|[Ff]rom|[Uu]ntil|[Tt]ill|[Yy]ear|[Cc]irca|[Bb]efore|[Aa]fter"  # "in 1999"
POINT = {"english": "point", "german": "Komma", "french": "virgule", "spanish": "coma", "italian": "virgola",
         "portuguese": "vírgula", "korean": "점"}
LANG_CODES = {"english": "en", "german": "de", "french": "fr", "spanish": "es", "italian": "it",
              "portuguese": "pt", "russian": "ru", "korean": "ko"}
_COMMA_DECIMAL = {"german", "french", "spanish", "italian", "portuguese", "russian"}


@dataclass
class Rules:
    """One language's rules: `apply(text)` gives the text with its numbers and symbols as words."""

    language: str
    code: str = field(init=False)
    pattern: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        self.code = LANG_CODES[self.language]
        comma = self.language in _COMMA_DECIMAL
        dec, group = (",", r"[.\u00a0\u202f ]") if comma else (r"\.", ",")
        num = rf"(?:\d{{1,3}}(?:{group}\d{{3}})+|\d+)(?:{dec}\d+)?"
        self._group, self._dec = group, dec
        units = "|".join(re.escape(u) for u in sorted(UNITS.get(self.language, {}), key=len, reverse=True))
        words = "|".join(re.escape(w) for w in ENGLISH_WORDS) if self.language == "english" else None
        rules = [
            rf"(?P<cur>[$€£₩])\s?(?P<amount>{num})",
            rf"(?P<amount2>{num})\s?(?P<cur2>€|\$|£|USD|EUR|GBP)(?!\w)",
            rf"(?P<pct>{num})\s?%",
            r"(?P<hh>[01]?\d|2[0-3]):(?P<mm>[0-5]\d)(?:\s?(?P<ampm>[aApP])\.?\s?[mM](?!\w))?",
            r"(?P<iy>\d{4})-(?P<im>0?[1-9]|1[0-2])-(?P<id>0?[1-9]|[12]\d|3[01])(?!\d)",
            r"(?P<da>\d{1,2})[/.](?P<db>\d{1,2})[/.](?P<dy>\d{4})(?!\d)",
            r"(?P<digits>\d{3,}(?:-\d{2,})+)(?![\w-])",  # a phone number, a code: digit by digit
            *([rf"(?P<usign>(?<![\w.,])-)?(?P<un>{num})\s?(?P<unit>{units})(?![\w/])"] if units else []),
            *([rf"(?P<ord>\d+)(?:{ORDINAL_SUFFIXES[self.language]})(?!\w)"] if self.language in ORDINAL_SUFFIXES
              else []),
            *([rf"(?P<before>\b(?:{YEAR_CUES})\s)(?P<year>1[1-9]\d\d|20\d\d)(?![\d,.]\d)"]
              if self.language == "english" else []),
            rf"(?P<sign>(?<![\w.,])-)?(?P<num>{num})",
            *([rf"(?<!\w)(?P<word>{words})(?!\w)"] if words else []),
        ]
        self.pattern = re.compile("|".join(rules))

    def apply(self, text: str) -> str:
        return self.pattern.sub(self._replace, text)

    # One match ----------------------------------------------------------------------------------------------------
    def _replace(self, m: re.Match[str]) -> str:
        handlers: dict[str, Callable[[re.Match[str]], str]] = {
            "cur": self._money, "amount2": self._money, "pct": self._percent, "hh": self._time, "iy": self._date,
            "da": self._date, "digits": self._digits, "un": self._unit, "ord": self._ordinal, "year": self._year,
            "num": self._number, "word": self._word}
        found = m.groupdict()
        name = next(k for k in handlers if found.get(k) is not None)
        return handlers[name](m)

    def _value(self, digits: str) -> Decimal | int:
        plain = re.sub(self._group, "", digits).replace(self._dec.strip("\\"), ".")
        return Decimal(plain) if "." in plain else int(plain)

    def _words(self, value: Decimal | int, **kw: str) -> str:
        if isinstance(value, Decimal) and not kw and value == value.to_integral() and self.language in POINT:
            places = len(str(value).partition(".")[2])
            zeros = " ".join([self._words(0)] * places)  # "2.0": num2words says "two"
            return f"{self._words(int(value))} {POINT[self.language]} {zeros}"
        return str(num2words(value, lang=self.code, **kw)).replace(",", "")

    def _number(self, m: re.Match[str]) -> str:
        value = self._value(m.group("num"))
        words = self._words(value)
        return f"{self._minus()} {words}" if m.group("sign") else words

    def _minus(self) -> str:
        return {"english": "minus", "german": "minus", "french": "moins", "spanish": "menos", "italian": "meno",
                "portuguese": "menos", "russian": "минус", "korean": "마이너스"}[self.language]

    def _money(self, m: re.Match[str]) -> str:
        amount = self._value(m.group("amount") or m.group("amount2"))
        currency = CURRENCIES[m.group("cur") or m.group("cur2")]
        if isinstance(amount, int):  # whole: no "zero cents"
            converter = CONVERTER_CLASSES[self.code]
            try:
                return f"{self._words(amount)} {converter.pluralize(amount, converter.CURRENCY_FORMS[currency][0])}"
            except (NotImplementedError, KeyError, AttributeError):
                pass
        try:
            return self._words(Decimal(amount), to="currency", currency=currency)
        except (NotImplementedError, KeyError, AttributeError):
            return f"{self._words(amount)} {currency}"

    def _percent(self, m: re.Match[str]) -> str:
        return f"{self._words(self._value(m.group('pct')))} {PERCENT[self.language]}"

    def _time(self, m: re.Match[str]) -> str:
        hour, minute, ampm = int(m.group("hh")), int(m.group("mm")), m.group("ampm")
        if self.language != "english":
            return " ".join(self._words(n) for n in (hour, minute) if n or n is hour)
        said = self._words(hour) + (" o'clock" if minute == 0 and not ampm else "")
        if minute:
            said += (" oh " if minute < 10 else " ") + self._words(minute)
        return f"{said} {'a m' if ampm.lower() == 'a' else 'p m'}" if ampm else said

    def _date(self, m: re.Match[str]) -> str:
        if m.group("iy"):
            year, month, day = int(m.group("iy")), int(m.group("im")), int(m.group("id"))
        else:
            a, b, year = int(m.group("da")), int(m.group("db")), int(m.group("dy"))
            month, day = (a, b) if self.language == "english" else (b, a)  # US order in English
        if not (1 <= month <= 12 and 1 <= day <= 31) or self.language not in MONTHS:
            return " ".join(self._words(n) for n in (day, month, year))
        name = MONTHS[self.language].split()[month - 1]
        year_words = self._words(year, to="year")
        match self.language:
            case "english":
                return f"{name} {self._words(day, to='ordinal')}, {year_words}"
            case "german":
                return f"{self._words(day, to='ordinal')} {name} {year_words}"
            case "spanish" | "portuguese":
                return f"{self._words(day)} de {name} de {year_words}"
            case _:
                first = "premier" if day == 1 and self.language == "french" else self._words(day)
                return f"{first} {name} {year_words}"

    def _unit(self, m: re.Match[str]) -> str:
        value = self._value(m.group("un"))
        one, many = UNITS[self.language][m.group("unit")]
        words = f"{self._words(value)} {one if value == 1 else many}"
        return f"{self._minus()} {words}" if m.group("usign") else words

    def _digits(self, m: re.Match[str]) -> str:
        return ", ".join(" ".join(self._words(int(d)) for d in group) for group in m.group("digits").split("-"))

    def _year(self, m: re.Match[str]) -> str:
        return m.group("before") + self._words(int(m.group("year")), to="year")

    def _ordinal(self, m: re.Match[str]) -> str:
        return self._words(int(m.group("ord")), to="ordinal")

    def _word(self, m: re.Match[str]) -> str:
        return ENGLISH_WORDS[m.group("word")]
