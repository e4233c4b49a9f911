"""Every user-facing string approvald shows in Slack, so wording is reviewed in one place.

Templates use :meth:`str.format` with named fields. Values put into them by the builders
(:mod:`bot.cards`, :mod:`bot.views`, :mod:`bot.threads`) are already escaped for mrkdwn;
nothing here escapes. Modal titles and button labels are plain text with Slack's small caps
(24 and 75 characters); tests build every one of them.
Slack date token strings (``DATE_*``) contain ``{date_short_pretty}``-style tokens that Slack
itself fills in, so they are never passed through ``str.format``.
"""

from __future__ import annotations

# -- approval cards -------------------------------------------------------------------------

HEADER_PENDING = "{emoji} Approval needed: {tool} · {risk} risk"
HEADER_QUESTION = ":warning: Did this happen? {tool}"
# a closed request's heading: its outcome's label (runtime.kernel.vocabulary), "Re-planned: pay"
HEADER_DONE = "{label}: {tool}"
HEADER_CANNOT_RUN = ":warning: Approved but not run: {tool}"
HEADER_CANNOT_RUN_DONE = "{label}: {tool} was not run"
FALLBACK_PENDING = "{agent} needs approval to run {tool} ({risk} risk)"
FALLBACK_QUESTION = "{agent}: did {tool} take effect? A human needs to answer"
FALLBACK_CANNOT_RUN = ("{agent}: approved {tool} cannot run on the deployed agent; a human "
                       "needs to answer")
FALLBACK_DONE = "{tool}: {status}"

RISK_EMOJI = {"low": ":large_green_circle:", "medium": ":large_yellow_circle:",
              "high": ":red_circle:"}
# an outcome's emoji is its Word's (runtime.kernel.vocabulary), drawn as ``:name:``
EMOJI = ":{name}:"
UNKNOWN_EMOJI = ":grey_question:"

INTRO = "*{agent}* wants to run `{tool}` for {requester}."
INTRO_DONE = "*{agent}* asked to run `{tool}` for {requester}."
INTRO_QUESTION = "*{agent}* started `{tool}` for {requester}; whether it took effect is unknown."
INTRO_CANNOT_RUN = ("*{agent}* was approved to run `{tool}` for {requester}, but the "
                    "deployed release of the agent cannot run it. It was *not executed*.")
INTRO_THREAD = " <{url}|Open the run's thread>"
INTRO_TASK = "*Task:* {task}"
SECTION_DOING = "*What the agent is doing*\n{text}"
SECTION_EVIDENCE = "*Evidence it used*"
EVIDENCE_ITEM = "• `{tool}`: {result}"
SECTION_IMPACT = "*Expected impact*\n{text}"
# after an edit: the impact of the arguments that will run, worked out by the tool's impact
# hook on them; the requester's words were about the arguments first asked for
SECTION_IMPACT_EDITED = "*Expected impact of the edited arguments*\n{text}"
DOING_BEFORE_EDIT = {"agent": "The agent asked for (before the edit):",
                     "caller": "The caller asked for (before the edit):"}
SECTION_DOING_BEFORE_EDIT = "*{label}*\n{text}"
# an impact nobody worked out for the edited arguments (an external caller's text, or an
# edit recorded before impacts were): shown only as what it is
IMPACT_BEFORE_EDIT = {
    "agent": "Impact of the original arguments (not worked out again for the edit):",
    "caller": "Impact, in the caller's description of the original arguments (before the edit):"}
SECTION_IMPACT_BEFORE_EDIT = "*{label}*\n{text}"
# the same, in one line (App Home, /approvals, modals, thread replies)
LINE_IMPACT = "*Impact:* {text}"
LINE_IMPACT_EDITED = "*Impact of the edited arguments:* {text}"
LINE_BEFORE_EDIT = "_{label}_ {text}"
SECTION_WHY = "*Why approval is needed*\n{text}"
SECTION_WHY_QUESTION = "*Why a human is asked*\n{text}"
SECTION_ARGS = "*Exact arguments*"
SECTION_ARGS_ORIGINAL = "*Arguments as originally requested*"
# beside the arguments when a sensitive value in them is shown masked
ARGS_MASKED = (":lock: _Sensitive values are masked (•••• 4242); the decision binds to the "
               "real values._")
SECTION_EDITED = "*Edited by an approver: these arguments run instead*"
SECTION_QUESTION = "*Idempotency key:* `{key}`"
SECTION_ATTEMPT = ("*Attempt {attempt}* started {started}; its worker was last heard from "
                   "{heard}.")
SECTION_WORKER = " Worker: {worker}."
SECTION_RECONCILE = "*What the tool's reconcile hook said:* {text}"
TRUNCATED = "_… truncated, {n:,} more characters_"
NOT_SHOWN = "_{n:,} more characters not shown: run `approvald approvals show {id}`_"

CTX_EXPIRES = ":alarm_clock: {date}"
CTX_OVERDUE = ":alarm_clock: The deadline passed {date}; closing this request"
CTX_APPROVERS = "Approvers: {who}"
CTX_ANYONE = "Approvers: anyone but the requester"
CTX_QUORUM = "*{count} of {quorum} approvals*"
CTX_RULE = "Chosen by policy rule `{rule}`"
CTX_QUORUM_BY = "*{count} of {quorum} approvals* ({who})"
CTX_ON_EXPIRE = {"cancel": "If nobody decides: cancelled, never approved",
                 "escalate": "If nobody decides: escalated to the next approvers"}
CTX_ID = "Request `{id}`"
CTX_ESCALATED_FROM = ":arrow_double_up: Escalated from an earlier request nobody answered in time"
CTX_ESCALATED_FROM_URL = (":arrow_double_up: Escalated from an <{url}|earlier request> "
                          "nobody answered in time")

# Slack date tokens (filled in by Slack in the reader's time zone)
DATE_EXPIRES = "expires {date_short_pretty} at {time}"
DATE_EXPIRED = "{date_short_pretty} at {time}"
DATE_AT = "{date_short_pretty} at {time}"
DATE_FALLBACK = "%Y-%m-%d %H:%M UTC"

BUTTON_APPROVE = "Approve"
BUTTON_DENY = "Deny"
BUTTON_EDIT = "Edit"
BUTTON_REDIRECT = "Redirect"
BUTTON_VIEW_ARGS = "View full arguments"
BUTTON_RETRY = "Retry"
BUTTON_MARK_DONE = "Mark done"
BUTTON_ABORT = "Abort"
BUTTON_REPLAN = "Re-plan"
CONFIRM_APPROVE_TITLE = "Approve a high-risk call?"
CONFIRM_APPROVE_TEXT = ("`{tool}` is high risk. The exact arguments on this card run as soon "
                        "as enough approvers agree.")
CONFIRM_APPROVE_YES = "Approve"
CONFIRM_RETRY_TITLE = "Run it again?"
CONFIRM_RETRY_TEXT = ("If the first attempt did take effect, retrying makes it happen twice. "
                      "Retry only if you checked that it did not.")
CONFIRM_RETRY_YES = "Retry"
CONFIRM_NO = "Cancel"

# ``label``: the outcome's label (runtime.kernel.vocabulary), as every view names it
DECIDED_APPROVED = "{emoji} *{label}* by {who} {date}{via}"
DECIDED_APPROVED_EDITED = "{emoji} *{label}* by {who} {date}{via}"
DECIDED_VOTERS = "Approvals: {who}"
DECIDED_DENIED = "{emoji} *{label}* by {who} {date}{via}"
DECIDED_REASON = "*Reason:* {reason}"
DECIDED_REDIRECTED = ("{emoji} *{label}* by {who}: {guidance}\n"
                      "Decided {date}{via}: the call did not run; the agent re-plans on "
                      "this guidance.")
DECIDED_EXPIRED = ("{emoji} *{label}* {date} with no decision. Silence never approves: "
                   "the call did not run.")
DECIDED_SUPERSEDED = ("{emoji} *{label}* {date}: the request went to the next "
                      "approvers.")
DECIDED_SUPERSEDED_URL = " <{url}|See the new request>"
DECIDED_SUPERSEDED_ID = " New request: `{id}`"
DECIDED_CANCELLED = ("{emoji} *{label}*{by} {date}: the run was cancelled, so this call "
                     "will not run.")
DECIDED_CANCELLED_BY = " by {who}"
DECIDED_RETRY = "{emoji} *{label}* by {who} {date}{via}: the call runs again."
DECIDED_MARK_DONE = ("{emoji} *{label}* by {who} {date}{via}: the run continues as if "
                     "it succeeded.")
DECIDED_ABORT = "{emoji} *{label}* by {who} {date}{via}: the run was cancelled."
DECIDED_REPLAN = ("{emoji} *{label}* by {who} {date}{via}: the agent was told the call "
                  "did not run, and plans again.")
DECIDED_NOT_EXECUTED = (":warning: *Not executed:* {reason}. A person decides what happens "
                        "next (re-plan or abort).")
DECIDED_OTHER = "{emoji} *{status}*"
DECIDED_VIA_CLI = " (from the command line)"
DECIDED_VIA_WEB = " (on the web review queue)"
WAITING = "{emoji} Waiting for a decision."
CTX_EDITED = ":pencil2: Arguments edited by {who} {date}"
CTX_PROPOSED = ":pencil2: Arguments proposed by {who} {date}: someone else must approve them"
CTX_VOTES_RESET = ("earlier approvals by {who} were on the previous arguments and no longer "
                   "count: approve again to count")
CANNOT_RUN_ASK = ("*Why it cannot run:* {reason}\n"
                  "*Re-plan* hands the agent this error: it plans again and asks again for "
                  "anything that needs approval. *Abort* ends the run.")
QUESTION_ASK = ("The process stopped before this call's result was recorded. "
                "Check the system it acts on, then tell the agent what happened.")

# -- compact cards (App Home, /approvals) ---------------------------------------------------

COMPACT_LINE = "{emoji} *`{tool}`* · {risk} risk · *{agent}* for {requester}"
COMPACT_QUESTION_LINE = "{emoji} *Did `{tool}` happen?* · *{agent}* for {requester}"
COMPACT_CANNOT_RUN_LINE = ("{emoji} *Approved `{tool}` cannot run* · *{agent}* for "
                           "{requester}")
RECENT_LINE = "{emoji} `{tool}` {status} by {who} {date}"
RECENT_LINE_NOBODY = "{emoji} `{tool}` {status} {date}"

HOME_TITLE = "Waiting for your approval"
HOME_EMPTY = ":sparkles: Nothing is waiting for your approval."
HOME_MORE = ("Showing the oldest {shown} of {total}. Decide these first, or see them all with "
             "`approvald approvals list --limit {total}`.")
HOME_RECENT_TITLE = "Recent decisions"
HOME_RECENT_EMPTY = "No decisions yet."
# the insights, for the deployment's operators (APPROVALD_OPERATORS; issue 51)
HOME_INSIGHTS_TITLE = "Insights: the last {window}"
HOME_INSIGHTS_SUMMARY = "{requests} requests, as of {at} · the same as `approvald insights`"
HOME_INSIGHTS_TOOL = ("*`{tool}`* · asked {asked} · approve {approve} · edit {edit} · "
                      "deny {deny} · expire {expire} · median {median} · p90 {p90}")
HOME_INSIGHTS_DENIED = "  denied for: {reasons}"
HOME_INSIGHTS_DECIDERS = "  decided by: {who}"
HOME_INSIGHTS_SHADOW = ("Shadow rule `{where}` ({when}): held for {matched}; people agreed "
                        "on {agreed} of {settled}")
HOME_INSIGHTS_SUGGESTED = "*Suggested rule* (paste into the policy file; nothing is applied)"
HOME_INSIGHTS_BROKEN = (":warning: The audit log does not verify, so its record is not read: "
                        "{why}")
HOME_INSIGHTS_EMPTY = "No requests in the window."
LIST_TITLE = "*{n} request(s) waiting for your approval*"
LIST_EMPTY = ":sparkles: Nothing is waiting for your approval."
LIST_MORE = ("… and {n} more. The App Home tab shows more at once, and "
             "`approvald approvals list --limit {total}` all of them.")

# -- batch decisions (App Home, /approvals) ---------------------------------------------------

BUTTON_APPROVE_SELECTED = "Approve selected"
BUTTON_DENY_SELECTED = "Deny selected"
SELECT_OPTION = "Select"
BATCH_HINT = ("Tick requests, then *Approve selected* or *Deny selected* (one reason for all). "
              "Each is still decided on its own, on the arguments shown here.")
GROUP_HEADER = "{tool} · {n} waiting"
CONFIRM_BATCH_TITLE = "Approve every selected request?"
CONFIRM_BATCH_TEXT = ("Each selected call runs on the exact arguments shown here as soon as "
                      "enough approvers agree. A request decided or edited since this list "
                      "was drawn is refused, not approved.")
CONFIRM_BATCH_YES = "Approve selected"
BATCH_NOTHING = (":information_source: Nothing was selected, so nothing changed. Tick the "
                 "requests to decide first.")
BATCH_SUMMARY = "*You decided {total} selected request(s):* {parts}"
BATCH_PART_APPROVED = ":white_check_mark: {n} approved"
BATCH_PART_VOTED = ":ballot_box_with_check: {n} approval(s) recorded, more approvers needed"
BATCH_PART_DENIED = ":no_entry_sign: {n} denied"
BATCH_PART_REFUSED = ":warning: {n} refused, nothing changed for them"
BATCH_PART_REPEATED = ":repeat: {n} already decided by you, as before"
BATCH_LINE_APPROVED = ":white_check_mark: Approved {label}"
BATCH_LINE_VOTED = ":ballot_box_with_check: Approval recorded ({count} of {quorum}) {label}"
BATCH_LINE_DENIED = ":no_entry_sign: Denied {label}"
BATCH_LINE_REFUSED = ":warning: Refused {label}: {why}"
BATCH_LINE_REPEATED = ":repeat: {label}: {why}"
BATCH_LABEL = "`{tool}` `{id}` `{args}`"
BATCH_LABEL_UNKNOWN = "`{id}`"
BATCH_LINES_MORE = "… and {n} more line(s): `approvald approvals list --all` shows every request."
BATCH_REFUSED = ":warning: {why}: nothing changed."
BATCH_TOO_MANY = "At most {most} requests can be decided at once ({n} selected)"
BATCH_ERROR = (":warning: Something went wrong while deciding ({error}). Decisions made before "
               "it are recorded; whatever still waits is listed below.")
MODAL_BATCH_DENY_TITLE = "Deny selected requests"
MODAL_BATCH_DENY_SUBMIT = "Deny selected"
MODAL_BATCH_DENY_INTRO = ("You are denying {n} request(s). Each agent receives your reason as "
                          "its call's result and may try another way. Untick any you do not "
                          "mean to deny.")
MODAL_BATCH_ITEMS = "Requests to deny"
MODAL_BATCH_ITEMS_MORE = "More requests to deny"
MODAL_BATCH_ITEM_NOTE = "{id} · requested by {who}"
MODAL_BATCH_NONE = "Tick at least one request to deny."
LIST_FALLBACK = "{n} approval request(s) waiting for you"

# -- standing approvals ("approve this, and calls like it, for a while") -------------------

BUTTON_STANDING = "Approve, and calls like this…"
MODAL_STANDING_TITLE = "Standing approval"
MODAL_STANDING_SUBMIT = "Approve and grant"
MODAL_STANDING_INTRO = ("Approve this call of `{tool}` now, and let later calls like it run "
                        "without a card for a while.")
MODAL_STANDING_WINDOW = "For how long"
WINDOW_LABELS = {"15m": "15 min", "30m": "30 min", "1h": "1 h", "2h": "2 h", "4h": "4 h",
                 "8h": "8 h"}
MODAL_STANDING_SCOPE = "Which calls"
SCOPE_EXACT = "Only this exact call"
SCOPE_EXACT_NOTE = "Same tool, every argument the same"
SCOPE_FIELDS = "Same tool, same values for:"
SCOPE_FIELDS_NOTE = "The arguments ticked below; the others may differ"
SCOPE_CONDITION = "Calls where… (CEL condition)"
SCOPE_CONDITION_NOTE = "The condition below, over args, must hold"
MODAL_STANDING_FIELDS = "Same values for"
MODAL_STANDING_FIELDS_HINT = "Used with “Same tool, same values for”."
MODAL_STANDING_FIELD_VALUE = "now {value}"
MODAL_STANDING_WHEN = "Condition (CEL)"
MODAL_STANDING_WHEN_HINT = ("Used with “Calls where…”. It sees args and tool, e.g. "
                            "args.amount_cents <= 5000; it must hold for this call too.")
MODAL_STANDING_EXPLAIN = (
    "*What this means:* it needs the same approvers and quorum as this request "
    "({quorum}), covers only calls this tool's policy would send to the same approvers, "
    "stops covering anything when its window ends or a granter leaves the approvers, and "
    "never covers a run its granter started (unless the tool allows self-approval). A "
    "granter or any approver can revoke it at once from the App Home (or `approvald "
    "standing revoke ID`). Every use is in the audit log and the run's thread, naming it.")
MODAL_STANDING_QUORUM_ONE = "one approval"
MODAL_STANDING_QUORUM = "{n} approvals: it covers nothing until {more} more approver(s) grant it"
MODAL_STANDING_NO_WINDOW = "Choose how long it lasts."
MODAL_STANDING_NO_SCOPE = "Choose which calls it covers."
MODAL_STANDING_NO_FIELDS = "Tick at least one argument whose value later calls must share."
MODAL_STANDING_NO_WHEN = "Write the condition later calls must meet."
MODAL_STANDING_BAD_SCOPE = "That scope was refused: {why}"

STANDING_SCOPE_EXACT_HERE = "only this exact call"
STANDING_SCOPE_EXACT = "only the exact call {args}"
STANDING_SCOPE_FIELDS = "calls with {pairs}"
STANDING_SCOPE_PAIR = "{name} = {value}"
STANDING_SCOPE_CONDITION = "calls where {when}"
STANDING_ON_CARD = (":repeat: *Standing approval* `{id}` granted by {who} for {window}: "
                    "{scope}.")
STANDING_ACTIVE = "Matching calls run without a card until {until} ({uses} use(s) so far)."
STANDING_PROPOSED = ("*{count} of {quorum} grants*: it covers nothing until another approver "
                     "grants it too (App Home, *Grant too*). Until {until}.")
STANDING_ACTIVE_GRANTS = "*{count} of {quorum} grants*. "
STANDING_REVOKED = "Revoked by {who} {date} after {uses} use(s)."
STANDING_EXPIRED = "Its window ended {date} after {uses} use(s)."

HOME_STANDING_TITLE = "Standing approvals"
HOME_STANDING_EMPTY = "None you granted or approve is live."
HOME_STANDING_LINE = ("{emoji} *`{tool}`* · {scope}\nUntil {until} · grants {count}/{quorum} "
                      "({who}) · {uses} use(s) · `{id}`")
HOME_STANDING_MORE = "…and {n} more: `approvald standing list`"
STANDING_EMOJI = {"active": ":repeat:", "proposed": ":ballot_box_with_check:"}
BUTTON_STANDING_REVOKE = "Revoke"
BUTTON_STANDING_GRANT = "Grant too"
CONFIRM_REVOKE_TITLE = "Revoke it now?"
CONFIRM_REVOKE_TEXT = ("From now on, calls of `{tool}` it covered need a card again. Calls it "
                       "already allowed stay approved.")
CONFIRM_REVOKE_YES = "Revoke"
CONFIRM_GRANT_TITLE = "Grant it too?"
CONFIRM_GRANT_TEXT = ("With your grant, calls of `{tool}` within its scope run without a card "
                      "until its window ends, and you are named on each use.")
CONFIRM_GRANT_YES = "Grant"
HOME_STANDING_REVOKED = ":no_entry_sign: You revoked standing approval `{id}` (`{tool}`)."
HOME_STANDING_GRANTED = (":ballot_box_with_check: You granted standing approval `{id}` "
                         "(`{tool}`): {count} of {quorum} grants{active}.")
HOME_STANDING_NOW_ACTIVE = ", so it is active"
HOME_STANDING_REFUSED = ":warning: Nothing changed: {why}"
STANDING_REFUSAL = {
    "not_authorized": ("You neither granted this standing approval nor approve its tool, so "
                       "you can't change it."),
    "already_granted": "You already granted it; another approver has to grant it too.",
    "not_live": "It is no longer live (revoked, or its window ended).",
    "changed": "It changed meanwhile (granted, revoked or expired): look at it again.",
    "off": "Standing approvals are turned off for this tool (max_standing = \"0\").",
    "window": "That window is not allowed for this tool.",
    "scope": "That scope does not cover this request.",
    "wrong_kind": "A standing approval is granted on a tool call's request only.",
}
REPLY_STANDING_PROPOSED = (":ballot_box_with_check: Your approval is recorded, and standing "
                           "approval `{id}` is proposed: {count} of {quorum} grants. It covers "
                           "nothing until another approver grants it too (their App Home, "
                           "*Grant too*).")
REPLY_STANDING_UNKNOWN = ":grey_question: That standing approval doesn't exist (any more)."

# -- modals (titles, submit and close labels are at most 24 characters) ---------------------

MODAL_ARGS_TITLE = "Full arguments"
MODAL_ARGS_INTRO = "Arguments of `{tool}` (request `{id}`), {n:,} characters:"
MODAL_CLOSE = "Close"
MODAL_CANCEL = "Cancel"
MODAL_DENY_TITLE = "Deny request"
MODAL_DENY_SUBMIT = "Deny"
MODAL_DENY_INTRO = ("You are denying `{tool}`. The agent receives your reason as the call's "
                    "result and may try another way.")
MODAL_DENY_INTRO_NO_TOOL = ("The agent receives your reason as the call's result and may try "
                            "another way.")
MODAL_REASON_LABEL = "Reason"
MODAL_DENY_PLACEHOLDER = "Why not? The agent will read this."
MODAL_REDIRECT_TITLE = "Redirect the agent"
MODAL_REDIRECT_SUBMIT = "Redirect"
MODAL_REDIRECT_INTRO = ("`{tool}` will not run. The agent receives your guidance as the "
                        "call's result and re-plans; whatever it asks for next needs "
                        "approval again.")
MODAL_REDIRECT_INTRO_NO_TOOL = ("The call will not run. The agent receives your guidance as "
                                "its result and re-plans.")
MODAL_GUIDANCE_LABEL = "Guidance"
MODAL_REDIRECT_PLACEHOLDER = ("What should the agent do instead? e.g. refund only the "
                              "duplicate charge")
MODAL_EDIT_TITLE = "Edit arguments"
MODAL_EDIT_SUBMIT = "Approve with edits"
MODAL_EDIT_INTRO = ("Edit the arguments of `{tool}` as JSON. Your edit is validated against "
                    "the tool's schema; submitting approves the edited call, and the original "
                    "is kept in the audit log.")
MODAL_PROPOSE_SUBMIT = "Propose edit"
MODAL_EDIT_MASKED = (":lock: Sensitive values are shown masked (•••• 4242, [masked]). Leave one "
                     "as shown to keep its real value; type a new value to replace it.")
MODAL_PROPOSE_INTRO = ("Edit the arguments of `{tool}` as JSON. Your edit is validated against "
                       "the tool's schema and replaces the arguments on the card; someone "
                       "other than you must then approve them. Earlier approvals stop "
                       "counting. The original is kept in the audit log.")
MODAL_EDIT_LABEL = "Arguments (JSON)"
MODAL_EDIT_REASON_LABEL = "Why this edit"
MODAL_EDIT_REASON_PLACEHOLDER = "Recorded in the audit log beside the edit"
MODAL_EDIT_HINT = "Checked against the schema of {tool} before anything is approved."
MODAL_EDIT_TOO_BIG = ("These arguments are {n:,} characters long, more than Slack lets a text "
                      "box hold ({limit:,}). Edit them from the command line:\n"
                      "`approvald approvals edit {id} --as YOUR_USER_ID --args 'JSON'`")
MODAL_ABORT_TITLE = "Abort the run"
MODAL_ABORT_SUBMIT = "Abort"
MODAL_ABORT_INTRO = ("Aborting cancels the whole run. `{tool}` is not run again and is not "
                     "marked done.")
MODAL_ABORT_INTRO_NO_TOOL = "Aborting cancels the whole run."
MODAL_ABORT_PLACEHOLDER = "What happened? This goes into the audit log."

EDIT_ERROR_JSON = "Not valid JSON: {error}"
EDIT_ERROR_OBJECT = "The arguments must be a JSON object, like {\"amount\": 10}."
EDIT_ERROR_DEEP = "The arguments are nested deeper than {n} levels."
EDIT_ERROR_ITEM = "{loc}: {msg}"
EDIT_ERROR_TOP = "{msg}"
EDIT_ERROR_GENERIC = "These arguments were refused by the tool's schema."
EDIT_ERROR_MORE = " (and {n} more)"

# -- ephemeral refusals ---------------------------------------------------------------------

REFUSAL = {
    "bad_token": "This button no longer belongs to a live request.",
    "not_authorized": "You're not an approver for this request.",
    "self_approval": ("You started this run, so you can't approve its calls. "
                      "Another approver has to decide."),
    "already_voted": ("You already voted on these arguments. It needs another approver "
                      "before it can run."),
    "stale_card": ("The arguments were edited after this card was drawn, so your click "
                   "didn't count. The card now shows the new arguments: review them and "
                   "decide again."),
    "expired": ("Too late: this request expired before your decision, so it didn't count. "
                "The request is closed (or went to the next approvers)."),
    "own_edit": ("You proposed these arguments, so someone else has to approve them "
                 "(this tool's policy separates editing from approving)."),
    "unchanged": "Those are the current arguments; nothing was changed.",
    "invalid_arguments": "Those arguments don't match the tool's schema.",
    "rule_changed": ("That edit would put the call under other policy rules than the ones "
                     "it was asked under, so nothing changed."),
    "wrong_kind": "That button doesn't apply to this kind of request.",
    "unknown_digest": ("Those arguments were never this request's, so nothing changed. "
                       "Decide on the card as it is now."),
    "unknown_approval": "That request doesn't exist (any more).",
    "reason_required": "Please give a reason: the agent reads it and can re-plan.",
    "reason_too_long": "That reason is too long: 2,000 characters at most.",
    "guidance_required": ("Please write guidance: what should the agent do instead? It reads "
                          "it and re-plans."),
    "guidance_too_long": "That guidance is too long: 2,000 characters at most.",
    "directory_unavailable": ("I couldn't check your approver group membership just now, so "
                              "nothing changed. Please try again in a minute."),
}
REFUSAL_NOT_PENDING = {
    "approved": "Too late: this request was already approved.",
    "denied": "Too late: this request was already denied.",
    "redirected": "Too late: this request was already redirected.",
    "expired": "Too late: this request expired before anyone decided, so the call did not run.",
    "superseded": ("Too late: this request expired and went to the next approvers. "
                   "This button is no longer live."),
    "cancelled": "Too late: the run was cancelled, so this request is closed.",
}
# the same, naming who decided (where mentions render)
REFUSAL_NOT_PENDING_BY = {
    "approved": "Too late: {who} already approved this request.",
    "denied": "Too late: {who} already denied this request.",
    "redirected": "Too late: {who} already redirected this request.",
}
REFUSAL_NOT_PENDING_OTHER = "This request has already been decided."
# a question already answered: ``words``, its outcome's (runtime.kernel.vocabulary)
REFUSAL_ANSWERED = "Too late: this question was already answered: {words}."
REFUSAL_ANSWERED_BY = "Too late: {who} already answered this question: {words}."
# naming the approvers (where mentions render)
REFUSAL_NOT_AUTHORIZED_WHO = "You're not an approver for this request (its approvers: {who})."
REFUSAL_UNKNOWN = "That didn't go through, and nothing changed."
# a refusal whose runtime message says what the wording cannot (a schema's complaint): the
# wording without its full stop, then the message, ending once
REFUSAL_DETAIL = "{text}: {detail}"

# -- reminders, notices, run threads ---------------------------------------------------------

REMINDER = (":alarm_clock: Reminder: `{tool}` for *{agent}* is still waiting for approval"
            "{progress}. It {expires} ({left} left).")
REMINDER_OVERDUE = (":alarm_clock: Reminder: `{tool}` for *{agent}* is still waiting; its "
                    "deadline has passed and it is being closed.")
REMINDER_QUESTION = (":alarm_clock: Reminder: someone still needs to say whether `{tool}` "
                     "took effect. The run of *{agent}* is stopped until then.")
REMINDER_CANNOT_RUN = (":alarm_clock: Reminder: approved `{tool}` cannot run on the deployed "
                       "agent; someone needs to choose re-plan or abort. The run of *{agent}* "
                       "is stopped until then.")
REMINDER_PROGRESS = " ({count} of {quorum} approvals)"
REMINDER_WHO = " {who}"
REMINDER_LINK = " <{url}|Open the request>"

NOTICE = ":information_source: `{tool}` ran without approval (its policy is notify-after)."
NOTICE_ARGS = "*Arguments*"
NOTICE_RESULT = "*Result*"

RUN_STATUS = {
    "running": (":arrows_counterclockwise:", "running"),
    "awaiting_approval": (":hourglass_flowing_sand:", "waiting for approval"),
    "needs_attention": (":warning:", "needs attention"),
    "completed": (":white_check_mark:", "completed"),
    "failed": (":x:", "failed"),
    "cancelled": (":no_entry_sign:", "cancelled"),
    # a caller's request (the HTTP API, the MCP gateway, a hook): open, or approved and
    # waiting for its caller to run the call and say what came of it
    "external": (":outbox_tray:", "asked; its caller runs the call"),
}
RUN_HEADLINE = "{emoji} *{agent}* · {status}"
RUN_TASK = "*Task:* {task}"
RUN_REQUESTED_BY = "Requested by {who}"
RUN_STEP = "Step {step}"
RUN_STARTED = "started {date}"  # a date stays true; "running for 2s" goes stale
RUN_TOOK = "took {elapsed}"
RUN_ID = "Details: `approvald trace {id}`"
RUN_ERROR = "*Error:* {error}"
RUN_RESULT = "*Result:* {result}"
RUN_FALLBACK = "{agent} run: {status}"
RUN_CANCEL_REQUESTED = ":octagonal_sign: cancellation requested"

THREAD_ERROR = ":x: *Error:* {error}"
RUN_WAITING = (":hourglass: Waiting until {date}: {reason}. Nothing failed; the run resumes "
               "by itself then.")
THREAD_FINAL = ":checkered_flag: *Final answer*\n{answer}"

# a run's story in its thread, one line per audit entry that changes who or what the run
# waits on (bot/slack/story.py); {who}: people as mentions, {until}: a Slack date; an
# outcome is said with the one vocabulary's words (runtime/kernel/vocabulary.py): {icon} its
# emoji, {outcome} its words, as every other view and the audit log name it
STORY_REQUESTED = (":hourglass_flowing_sand: Asked {approvers} to approve `{tool}`{quorum}, "
                   "until {until}.{link}")
STORY_REQUESTED_QUESTION = (":warning: `{tool}` may or may not have taken effect: asked "
                            "{approvers} to say which, until {until}.{link}")
STORY_REQUESTED_CANNOT_RUN = (":warning: `{tool}` was approved but *not executed*: "
                              "{reason}. Asked {approvers} to re-plan or abort, until "
                              "{until}.{link}")
STORY_QUORUM = " ({n} approvals needed)"
STORY_LINK = " <{url}|Open the request>"
STORY_NEW_LINK = " <{url}|Open the new request>"
STORY_REMINDED = (":alarm_clock: Reminder {n} sent to {approvers}: `{tool}` is still "
                  "waiting{progress}; it {expires}.{link}")
STORY_VOTED = (":ballot_box_with_check: {who} approved `{tool}` ({count} of {quorum} "
               "approvals); waiting for more.")
STORY_APPROVED = "{icon} `{tool}` {outcome} by {who}{votes}."
STORY_VOTES = " ({count} of {quorum} approvals: {who})"
STORY_STANDING = ("{icon} `{tool}` {outcome}: `{id}`, granted by {who}; nobody was asked "
                  "this time.")
STORY_POLICY = "{icon} `{tool}` {outcome}: the policy allows it."
STORY_DENIED = "{icon} `{tool}` {outcome} by {who}{reason}. It did not run."
STORY_REDIRECTED = ("{icon} `{tool}` {outcome} by {who}{reason}. It did not run; the agent "
                    "re-plans.")
STORY_REASON = ": {reason}"
STORY_EDITED_ARGS = "*Edited arguments:* `{args}`"
STORY_EDITED = ":pencil2: {who} edited the arguments of `{tool}`.{impact}"
STORY_EXPIRED = ("{icon} Nobody decided `{tool}` by its deadline: {outcome}; it did not run "
                 "(silence never approves).")
STORY_ESCALATED = ("{icon} Nobody decided `{tool}` in time: {outcome} to {approvers}, to "
                   "decide by {until}.{link}")
STORY_RUN_CANCELLED = ":no_entry_sign: {who} cancelled the run{reason}."
STORY_CANCEL_REQUESTED = (":octagonal_sign: {who} asked to cancel the run{reason}; it stops "
                          "at its next step.")
STORY_RESOLVED = {
    "retry": "{icon} `{tool}` {outcome} by {who}, who checked that it did not take effect.",
    "mark_done": "{icon} `{tool}` {outcome} by {who}: the run goes on as if it succeeded.",
    "abort": "{icon} `{tool}` {outcome} by {who}: the run ends here.",
    "replan": "{icon} `{tool}` {outcome} by {who}: the agent plans again.",
}
STORY_RESOLVED_OTHER = "{icon} `{tool}` {outcome} by {who}."
STORY_NOT_EXECUTED = ":warning: `{tool}` was approved but not executed: {reason}."
STORY_RETRIED = (":repeat: `{tool}` runs again as attempt {attempt}: attempt {before} was cut "
                 "off before its result was recorded, and {why}.{once}")
STORY_RETRIED_ONCE = " The call ran once."
STORY_RETRIED_IDEMPOTENT = (" The tool is idempotent: had attempt {before} taken effect, "
                            "running it again under the same key changes nothing.")
STORY_RAN = ":white_small_square: `{tool}` succeeded{attempt}{how}{words}"
STORY_RAN_FAILED = ":small_red_triangle: `{tool}` failed{attempt}{how}: {error}"
STORY_ATTEMPT = " on attempt {n}"
STORY_NOTIFY = " (ran without asking: its policy is notify-after)"
STORY_WORDS = ": {words}"
STORY_MORE = " and {n} more"
BUTTON_SHOW_JSON = "Show JSON"
MODAL_JSON_TITLE = "Tool result"
MODAL_JSON_INTRO = "What `{tool}` returned{attempt}:"
MODAL_JSON_GONE = "That result is no longer recorded."
STORY_ANYONE = "anyone but {who}"
STORY_ANYONE_NOBODY = "anyone but the requester"
# how a person who acted elsewhere than Slack is named
PERSON_VIA = {"cli": "{who} (on the command line)", "web": "{who} (on the web review queue)",
              "api": "{who} (through the HTTP API)", "mcp": "{who} (through MCP)"}
PERSON_SYSTEM = {"system:expiry": "the expiry scheduler", "system:policy": "the policy",
                 "system:runtime": "approvald", "system:standing": "a standing approval"}

# the parent: what the run waits on, from whom, until when
RUN_WAITS_ON = "*Waiting on* {approvers} to approve `{tool}`{progress} until {until}"
RUN_WAITS_ON_QUESTION = ("*Waiting on* {approvers} to say whether `{tool}` took effect, "
                         "until {until}")
RUN_WAITS_ON_CANNOT_RUN = ("*Waiting on* {approvers} to re-plan or abort `{tool}`, until "
                           "{until}")
RUN_WAITS_PROGRESS = " ({count} of {quorum} approvals so far)"
RUN_WAITS_IMPACT = "_{impact}_"
RUN_AT_STEP = "Step {step}"
# a finished run's honest headline: what did not happen is not a green check
# (the icon and {outcome} of a request's outcome are the vocabulary's; a failed call is
# an execution's, not a request's)
RUN_ENDED = "completed, but `{tool}` {outcome} and did not run"
RUN_ENDED_FAILED = (":warning:", "completed, but `{tool}` failed")
ELLIPSIS = "…"


# -- replies from the Slack handlers ----------------------------------------------------------
REPLY_UNKNOWN_APPROVAL = ":grey_question: That request doesn't exist (any more)."
REPLY_MALFORMED = ":warning: That button is damaged; nothing was changed."
REPLY_VOTED = ":ballot_box_with_check: Your approval is recorded: {count} of {quorum}."
REPLY_PROPOSED = (":pencil2: Your edit is recorded. Someone else has to approve the new "
                  "arguments before they run.")
REPLY_VOTES_RESET = (" Earlier approvals by {who} were on the previous arguments and no "
                     "longer count; they have been asked on the card to approve again.")
# the person who decided a request deciding it the same way again: nothing changes
REPLY_REPEATED = {
    "approved": "You already approved this request; your decision stands.",
    "denied": "You already denied this request; your decision stands.",
    "redirected": "You already redirected this request; your decision stands.",
}
REPLY_REPEATED_OTHER = "You already answered this request; your answer stands."
REPLY_ERROR = ":warning: Something went wrong recording that; nothing was changed. ({error})"


# -- the audit channel ------------------------------------------------------------------------
AUDIT_HEAD = (":lock: Audit log head, {date}: `{head}`\nKeep this message: "
              "`approvald audit verify --expect {head}` proves later that no entry up to it "
              "was changed, and none after it cut off.")


# -- a delivery that was given up (posted to the ops channel, in the run's thread if any) -----
DEAD_CARD_POST = ("The approval card for `{tool}` (request `{approval}`) was never posted, so "
                  "nobody has been asked to decide it")
DEAD_CARD_UPDATE = ("The card for `{tool}` (request `{approval}`) could not be updated, so it "
                    "may not show the request as it now stands")
DEAD_REMINDER = "A reminder about `{tool}` (request `{approval}`) could not be posted"
DEAD_NOTICE = "The notice that `{tool}` ran could not be posted"
DEAD_AUDIT_HEAD = "The audit log head could not be posted to the audit channel"
DEAD_OTHER = "A `{kind}` message could not be delivered"
DEAD_DELIVERY = (":rotating_light: *Delivery given up.* {what}.\n"
                 "Last error: {error} ({attempts} attempt(s), {waits} wait(s)).\n{retry}")
DEAD_RETRY = "Once the cause is fixed, re-drive it with `approvald outbox retry {id}`."
DEAD_DECIDE_HERE = ("\nThe request is still open; it can also be decided from a terminal: "
                    "`approvald approvals approve|deny {approval} --as YOUR_SLACK_USER_ID`.")
