"""``python -m approvald.bot.cli ARGS``: the ``approvald`` command."""

import sys

from approvald.bot.cli.root import main

sys.exit(main())
