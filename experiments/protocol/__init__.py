"""The culture-only learning protocol (`protocol:` in an experiment): rest, play with feedback, rest.

The encoder and the decoder are frozen at a fixed mapping, so that whatever changes between the phases of a
session can only be the culture. Read in this order:

    settings.py   the `protocol:` section, what it fixes in the experiment, the four paired conditions
    rest.py       a rest phase: record-only exchanges (every frequency and amplitude 0) on each env runner
    stats.py      the pre-registered statistics: early against late play, rest before against rest after
    session.py    the trial's side: rest before the first iteration, the play's stop, rest after, protocol.json
"""
