"""The `sweep` command line and what it shows: the commands (`commands`, whose `main` the `sweep` script and
`python -m kubesweep` run), their options and sweep-name arguments (`options`, `names`), `sweep images`
(`images`), and the views (`views`, `results_view`, `search_view`, `trial_progress`, fitted to the terminal by
`table_fit`, text from outside printed as text by `terminal_text`)."""

from kubesweep.cli.commands import main as main
