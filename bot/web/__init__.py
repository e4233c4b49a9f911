"""The web face: the review queue served by ``serve`` at ``/review``, its passwordless
sign-in (single-use links mailed to approvers) and the mails themselves."""
