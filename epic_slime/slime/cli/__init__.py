"""The slime driver's command line: the project's flags, the one-pass parse and the flags it adds for
slime, their checks, the option strings of the real parsers, the launchers' YAML -> flags and dry run.
None of these modules imports slime."""
