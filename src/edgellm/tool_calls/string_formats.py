"""JSON Schema's string `format`s as regexes of the raw text: an XML argument's value is the string
itself, not JSON, so its grammar holds the text to the format where the JSON grammar (llguidance's)
holds a JSON string's content. The same formats, each accepting the same texts as llguidance 1.9
does (tests/test_tool_calls.py checks them against it, string by string); written from the RFCs:
RFC 3339 (date, time, date-time, duration - its appendix A), RFC 5321 (email: a dot-string local
part, a domain or an IPv4 literal), RFC 1123 (hostname), RFC 3986 (uri; IPv6 in its h16 forms,
without an embedded IPv4 address), RFC 4122 (uuid, any version). None: no limit."""

from __future__ import annotations

# a date: 31-day months, 30-day months, February up to the 29th (any year)
DATE = ("[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
        "|02-(?:0[1-9]|[12][0-9]))")
# hh:mm:ss (a leap second 60 allowed), a fraction, then a zone: Z or an offset (both required)
TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"


def _duration() -> str:
    n = "[0-9]+"
    second = f"{n}S"
    minute = f"{n}M(?:{second})?"
    hour = f"{n}H(?:{minute})?"
    time = f"T(?:{hour}|{minute}|{second})"
    month = f"{n}M(?:{n}D)?"
    year = f"{n}Y(?:{month})?"
    date = f"(?:{n}D|{month}|{year})(?:{time})?"
    return f"P(?:{date}|{time}|{n}W)"


_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"


def _ipv6() -> str:
    """Eight groups, or p groups, "::", then s groups with p + s <= 7."""
    h = "[0-9a-fA-F]{1,4}"
    forms = [f"(?:{h}:){{7}}{h}"]
    for p in range(8):
        head = f"(?:{h}:){{{p - 1}}}{h}" if p else ""
        tail = f"(?:{h}(?::{h}){{0,{6 - p}}})?" if p < 7 else ""
        forms.append(f"{head}::{tail}")
    return "|".join(f"(?:{f})" for f in forms)


IPV6 = _ipv6()
_LABEL = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_ATEXT = "[a-zA-Z0-9!#$%&'*+\\-/=?^_`{|}~]"
_SUB_DOMAIN = "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
EMAIL = f"{_ATEXT}+(?:\\.{_ATEXT}+)*@(?:{_SUB_DOMAIN}(?:\\.{_SUB_DOMAIN})*|\\[{IPV4}\\])"


def _uri() -> str:
    pct = "%[0-9a-fA-F]{2}"
    unreserved_sub = "a-zA-Z0-9\\-._~!$&'()*+,;="
    pchar = f"(?:[{unreserved_sub}:@]|{pct})"
    userinfo = f"(?:[{unreserved_sub}:]|{pct})*"
    ip_literal = f"\\[(?:{IPV6}|v[0-9a-fA-F]+\\.[{unreserved_sub}:]+)\\]"
    host = f"(?:{ip_literal}|(?:[{unreserved_sub}]|{pct})*)"  # (an IPv4 address is a reg-name too)
    authority = f"(?:{userinfo}@)?{host}(?::[0-9]*)?"
    segment, segment_nz = f"{pchar}*", f"{pchar}+"
    hier = (f"//{authority}(?:/{segment})*"  # "//" authority path-abempty
            f"|/(?:{segment_nz}(?:/{segment})*)?"  # path-absolute
            f"|{segment_nz}(?:/{segment})*"  # path-rootless
            "|")  # path-empty
    rest = f"(?:[{unreserved_sub}:@/?]|{pct})*"
    return f"[a-zA-Z][a-zA-Z0-9+\\-.]*:(?:{hier})(?:\\?{rest})?(?:#{rest})?"


STRING_FORMATS: dict[str, str | None] = {
    "date": DATE,
    "time": TIME,
    "date-time": f"{DATE}[tT]{TIME}",
    "duration": _duration(),
    "email": EMAIL,
    "hostname": f"{_LABEL}(?:\\.{_LABEL})*",
    "ipv4": IPV4,
    "ipv6": IPV6,
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": _uri(),
    "unknown": None,  # (llguidance's name for any text)
}
