"""Thin command-line front end: each module registers one subcommand and calls one library function."""
