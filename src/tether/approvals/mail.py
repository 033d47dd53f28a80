"""EmailNotifier: a mail to an approval's reviewers when it is asked for (what is asked, the
options, the expiry, the deep link to the inbox) and a short one when it ends, over SMTP with
the standard library, in a thread. TLS is implicit (smtps://) or STARTTLS (?starttls=true), never
downgraded; a password never travels in clear to another host. It never puts the operation or
the context in a mail, and never logs or raises the password.
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import logging
import smtplib
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from urllib.parse import parse_qsl, unquote, urlsplit

from tether.approvals.message import Sent, Summary, event_key, outcome, public_url_of
from tether.approvals.model import Approval, Decision
from tether.errors import ConfigurationError, PermanentError
from tether.redact import redact_text
from tether.text import visible

log = logging.getLogger("tether.approvals")

# Who gets the mail of an approval, from each entry of its reviewers ("alice", "group:sre",
# "*"): a mapping from entry to addresses, or a function of the entry.
Addresses = Mapping[str, Sequence[str]] | Callable[[str], Iterable[str]]

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def _loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _address(value: object, what: str) -> str:
    """One bare address (`name@example.com`): nothing that could end a header or start another
    address."""
    ok = (
        isinstance(value, str)
        and value.count("@") == 1
        and 3 <= len(value) <= 254
        and not any(c.isspace() or ord(c) < 32 or c in '<>,;:"()[]\\' for c in value)
        and value.split("@")[0]
        and value.split("@")[1]
    )
    if not ok:
        raise ConfigurationError(f"{what}: {value!r} is not an email address (name@example.com)")
    assert isinstance(value, str)
    return value


class EmailNotifier:
    """Mails approvals to their reviewers over SMTP (docs/approvals.md, Notifiers).

    `url`: `smtp://[user:password@]host[:25]`, `smtps://...[:465]` (implicit TLS) or
    `smtp://...?starttls=true` (STARTTLS required). `sender`: the From address. Recipients: `to`
    (every approval) and `addresses` (a mapping or function from a reviewers entry, such as
    `alice` or `group:sre`, to addresses). `public_url` (default $TETHER_PUBLIC_URL) is where
    reviewers reach the inbox; the mail links to `{public_url}/approvals/{id}`. `tls`: the SSL
    context (default: the system's CAs, hostname checked). Each mail has a Message-ID made of
    the approval id and the event, the same when a retried step sends it again."""

    def __init__(
        self,
        url: str,
        *,
        sender: str,
        to: Sequence[str] = (),
        addresses: Addresses | None = None,
        public_url: str | None = None,
        timeout: float = 10.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._parse(url)
        _, bare = parseaddr(sender) if isinstance(sender, str) else ("", "")
        if not isinstance(sender, str) or any(ord(c) < 32 for c in sender):
            raise ConfigurationError(f"EmailNotifier: sender is one address, not {sender!r}")
        self.sender = sender
        self.sender_address = _address(bare, "EmailNotifier sender")
        if isinstance(to, str):
            raise ConfigurationError("EmailNotifier: `to` is a list of addresses, not one string")
        self.to = tuple(_address(a, "EmailNotifier to") for a in to)
        if addresses is not None and not (isinstance(addresses, Mapping) or callable(addresses)):
            raise ConfigurationError(
                "EmailNotifier: addresses is a mapping or a function from a reviewers entry "
                "('alice', 'group:sre') to email addresses"
            )
        if not self.to and addresses is None:
            raise ConfigurationError(
                "EmailNotifier needs recipients: to=['ops@example.com'] and/or addresses={"
                "'group:sre': ['sre@example.com']} (a reviewers entry to its addresses)"
            )
        self.addresses = addresses
        self.public_url = public_url_of(public_url, "EmailNotifier")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"EmailNotifier: timeout is seconds > 0, not {timeout!r}")
        self.timeout = float(timeout)
        self.tls = tls or ssl.create_default_context()
        self._sent = Sent()

    def _parse(self, url: str) -> None:
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            port = None if parts is None else parts.port
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ConfigurationError(
                "EmailNotifier: the SMTP URL is smtp://[user:password@]host[:port], smtps://... "
                "(implicit TLS) or smtp://...?starttls=true; got "
                f"{'a URL that is not one' if isinstance(url, str) else repr(url)}"
            )
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(options) - {"starttls"}
        if unknown:
            raise ConfigurationError(
                f"EmailNotifier: the SMTP URL takes only ?starttls=true|false, not "
                f"{', '.join(sorted(unknown))}"
            )
        flag = options.get("starttls", "false").lower()
        if flag not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigurationError(f"EmailNotifier: starttls is true or false, not {flag!r}")
        self.implicit_tls = parts.scheme == "smtps"
        self.starttls = flag in ("true", "1", "yes")
        if self.implicit_tls and self.starttls:
            raise ConfigurationError(
                "EmailNotifier: smtps:// is TLS from the start; ?starttls=true is for smtp://"
            )
        self.host = parts.hostname
        self.port = port or (465 if self.implicit_tls else 25)
        self.user = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        if self.user and not (self.implicit_tls or self.starttls) and not _loopback(self.host):
            raise ConfigurationError(
                f"EmailNotifier: smtp://{self.host} without TLS would send the password in "
                f"clear; use smtps://{self.host}:465 or smtp://{self.host}:587?starttls=true"
            )

    def __repr__(self) -> str:
        tls = "?starttls=true" if self.starttls else ""
        user = f"{self.user}:***@" if self.user else ""
        scheme = "smtps" if self.implicit_tls else "smtp"
        return f"EmailNotifier('{scheme}://{user}{self.host}:{self.port}{tls}')"

    # -- the Notifier protocol --------------------------------------------------------------

    async def approval_requested(self, approval: Approval) -> None:
        summary = Summary.of(approval, self.public_url)
        text = "\n".join([
            summary.title, "", *([summary.description, ""] if summary.description else []),
            f"Options: {', '.join(summary.options)}",
            f"Asked of: {', '.join(summary.reviewers) or 'nobody named'}",
            f"Expires: {summary.expires}",
            f"Run: {summary.run_id}",
            "",
            f"Decide in the inbox: {summary.link}",
            "",
            "The operation and its context are shown in the inbox only, never by mail.",
        ])  # fmt: skip
        e = html.escape
        description = e(summary.description).replace("\n", "<br>")
        page = (
            f"<html><body><h2>{e(summary.title)}</h2>"
            + (f"<p>{description}</p>" if summary.description else "")
            + f"<p>Options: {e(', '.join(summary.options))}<br>"
            f"Asked of: {e(', '.join(summary.reviewers) or 'nobody named')}<br>"
            f"Expires: {e(summary.expires)}<br>Run: {e(summary.run_id)}</p>"
            f'<p><a href="{e(summary.link)}">Decide in the inbox</a></p>'
            f"<p><small>The operation and its context are shown in the inbox only, never by "
            f"mail.</small></p></body></html>"
        )
        await self._mail(approval, "requested", f"Approval requested: {summary.title}", text,
                         page)  # fmt: skip

    async def approval_decided(self, approval: Approval, decision: Decision) -> None:
        summary = Summary.of(approval, self.public_url)
        said = outcome(decision)
        text = f"{summary.title}\n\nDecided: {said}\n\n{summary.link}\n"
        e = html.escape
        page = (
            f"<html><body><p>{e(summary.title)}</p><p>Decided: {e(said)}</p>"
            f'<p><a href="{e(summary.link)}">{e(summary.link)}</a></p></body></html>'
        )
        await self._mail(approval, "decided", f"Decided: {summary.title} ({said})", text, page)

    # -- sending ----------------------------------------------------------------------------

    def recipients(self, approval: Approval) -> list[str]:
        """`to`, then each reviewers entry's addresses, once each in that order; an address
        that is not one is left out with a warning (it comes from code or data outside)."""
        found = dict.fromkeys(self.to)
        for entry in approval.reviewers:
            if self.addresses is None:
                break
            if isinstance(self.addresses, Mapping):
                mapped: Iterable[str] = self.addresses.get(entry, ())
            else:
                mapped = self.addresses(entry) or ()
            for address in [mapped] if isinstance(mapped, str) else mapped:
                try:
                    found[_address(address, f"addresses of {entry!r}")] = None
                except ConfigurationError as exc:
                    log.warning("EmailNotifier: %s; approval %s", visible(str(exc), newlines=False),
                                approval.id)  # fmt: skip
        return list(found)

    def message_id(self, approval: Approval, event: str) -> str:
        """The same for every retry of one notification (see message.event_key)."""
        return f"<tether.{event_key(approval, event)}@{self.sender_address.split('@')[1]}>"

    async def _mail(self, approval: Approval, event: str, subject: str, text: str,
                    page: str) -> None:  # fmt: skip
        key = event_key(approval, event)
        if key in self._sent:
            return  # sent by an earlier attempt of this step, in this process
        recipients = self.recipients(approval)
        if not recipients:
            log.warning("EmailNotifier: nobody to mail about approval %s (reviewers %s map to "
                        "no address)", approval.id, visible(", ".join(approval.reviewers),
                                                            newlines=False))  # fmt: skip
            return
        message = EmailMessage()
        message["Subject"] = subject  # cleaned: no CR or LF can reach it (message.clean)
        message["From"] = self.sender
        message["To"] = ", ".join(recipients)
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = self.message_id(approval, event)
        if event != "requested":  # threads under the request in mail clients
            message["In-Reply-To"] = message["References"] = self.message_id(approval, "requested")
        message["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
        message["X-Tether-Approval"] = approval.id
        message.set_content(text)
        message.add_alternative(page, subtype="html")
        await asyncio.to_thread(self._deliver, message, recipients)
        self._sent.add(key)

    def _where(self) -> str:
        return repr(self)[len("EmailNotifier(") : -1]

    def _deliver(self, message: EmailMessage, recipients: list[str]) -> None:
        """One SMTP session (blocking: run in a thread). 5xx answers are permanent; network
        errors and 4xx are retried by the notify step."""
        where = self._where()
        try:
            smtp: smtplib.SMTP
            if self.implicit_tls:
                smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout,
                                        context=self.tls)  # fmt: skip
            else:
                smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
            with smtp:
                if self.starttls:
                    smtp.starttls(context=self.tls)  # raises when not offered: never in clear
                if self.user is not None:
                    smtp.login(self.user, self._password or "")
                refused = smtp.send_message(message, from_addr=self.sender_address,
                                            to_addrs=recipients)  # fmt: skip
        except smtplib.SMTPNotSupportedError:
            raise PermanentError(
                f"{where} offers no STARTTLS: the mail was not sent in clear. Use smtps:// or "
                f"a server with STARTTLS"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise PermanentError(
                f"{where}: its TLS certificate does not verify ({exc.verify_message}); give "
                f"EmailNotifier(tls=...) a context that trusts it"
            ) from None
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            error = PermanentError if all(c >= 500 for c in codes) else ConnectionError
            raise error(f"{where} refused every recipient (codes {sorted(set(codes))})") from None
        except smtplib.SMTPResponseException as exc:
            raw = exc.smtp_error
            said = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            said = redact_text(said)[:200]
            error = PermanentError if exc.smtp_code >= 500 else ConnectionError
            raise error(
                f"{where} answered {exc.smtp_code} {visible(said, newlines=False)}"
            ) from None
        except (smtplib.SMTPException, OSError) as exc:
            raise ConnectionError(
                f"{where} could not take the mail: {type(exc).__name__}"
            ) from None
        if refused:
            log.warning("EmailNotifier: %s refused %d of %d recipients", where, len(refused),
                        len(recipients))  # fmt: skip
