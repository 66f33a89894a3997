"""Command-line tools: translate and sample read a trained run; check_install checks the
install on this machine's accelerator; pretune tunes a config's 'auto' attention calls ahead
of a run; show_config lists a config's fields."""
