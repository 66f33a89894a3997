"""Language codes (config.data.source_lang, target_lang), read one way by every library a run
hands them to.

sacreBLEU picks its tokenizer by the exact codes 'zh', 'ja' and 'ko' (`relpos.scoring`), and
sacremoses' Moses detokenizer its rules by the exact codes 'en', 'fr', 'it', 'ga', 'cs', 'fi'
and 'ko' (`relpos.data.parallel_text.moses_detokenize`); any other code gets their defaults
(13a; the language-independent rules), silently: 'ZH' scored Chinese with 13a
(`relpos.scoring`), and 'EN', 'en-US' or 'eng' detokenised "It &apos;s" as "It 's" where 'en'
gives "It's". `primary_language` reads a code as a language tag, once for both: any case, the region
or script subtags after '-' or '_' dropped ('zh-CN', 'zh_Hans', 'en-US'), and the ISO 639-2/3
codes of the languages below (Tatoeba writes 'deu', 'cmn', 'jpn') taken as their two-letter
ones. A code it does not know stays as its lowercased primary subtag, which both libraries
treat as a language they have no rules of: for most languages (German, Spanish, Russian, ...)
their defaults are the rules, which is why a language they do not know is no warning.
"""

import re

# ISO 639-2/T, 639-2/B (where it differs) and 639-3 codes to the ISO 639-1 code, for the
# languages of WMT and Tatoeba corpora and those sacreBLEU or Moses has rules of; the Chinese
# varieties that corpora tag on their own (the members of ISO 639-3's macrolanguage zho:
# Mandarin cmn, Cantonese yue, Wu wuu, Min Nan nan, Hakka hak, Gan gan, Xiang hsn, ...; and
# Literary Chinese lzh) as Chinese, which sacreBLEU tokenises as 'zh': written in Hanzi they
# have no spaces to split on, and its 'zh' tokenizer leaves text in other scripts to 13a's
# rules, so a variety Tatoeba writes in Latin letters (Min Nan's POJ) scores as with 13a.
_TWO_LETTER_CODES = {
  'ara': 'ar', 'bul': 'bg', 'ben': 'bn', 'cat': 'ca', 'ces': 'cs', 'cze': 'cs',
  'cym': 'cy', 'wel': 'cy', 'dan': 'da', 'deu': 'de', 'ger': 'de', 'ell': 'el',
  'gre': 'el', 'eng': 'en', 'spa': 'es', 'est': 'et', 'eus': 'eu', 'baq': 'eu',
  'fas': 'fa', 'per': 'fa', 'fin': 'fi', 'fra': 'fr', 'fre': 'fr', 'gle': 'ga',
  'guj': 'gu', 'hau': 'ha', 'heb': 'he', 'hin': 'hi', 'hrv': 'hr', 'hun': 'hu',
  'hye': 'hy', 'arm': 'hy', 'ind': 'id', 'isl': 'is', 'ice': 'is', 'ita': 'it',
  'iku': 'iu', 'jpn': 'ja', 'kat': 'ka', 'geo': 'ka', 'kaz': 'kk', 'khm': 'km',
  'kor': 'ko', 'lit': 'lt', 'lav': 'lv', 'mkd': 'mk', 'mac': 'mk', 'msa': 'ms',
  'may': 'ms', 'nld': 'nl', 'dut': 'nl', 'nor': 'no', 'pol': 'pl', 'pus': 'ps',
  'por': 'pt', 'ron': 'ro', 'rum': 'ro', 'rus': 'ru', 'slk': 'sk', 'slo': 'sk',
  'slv': 'sl', 'sqi': 'sq', 'alb': 'sq', 'srp': 'sr', 'swe': 'sv', 'swa': 'sw',
  'tam': 'ta', 'tha': 'th', 'tur': 'tr', 'ukr': 'uk', 'urd': 'ur', 'vie': 'vi',
  'xho': 'xh', 'zul': 'zu', 'zho': 'zh', 'chi': 'zh', 'cmn': 'zh', 'yue': 'zh',
  'wuu': 'zh', 'nan': 'zh', 'hak': 'zh', 'gan': 'zh', 'hsn': 'zh', 'cdo': 'zh',
  'cjy': 'zh', 'cpx': 'zh', 'czh': 'zh', 'czo': 'zh', 'mnp': 'zh', 'lzh': 'zh',
}  # fmt: skip


def primary_language(code: str) -> str:
  """The two-letter code of the language tag `code` ('de-DE', 'DE', 'deu', 'ger' -> 'de';
  'zh_Hans', 'cmn' -> 'zh'), or its lowercased primary subtag where it is no code of the
  languages known here (module docstring)."""
  primary = re.split(r'[-_]', code.strip(), maxsplit=1)[0].lower()
  return _TWO_LETTER_CODES.get(primary, primary)
