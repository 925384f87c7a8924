"""The closed-loop core: what runs on an env runner between the module's output and the game's action.

Read in this order:

* `tick` - one tick as a plain function: encode, send the stimulation, work that
  needs no spikes, receive, ablate, decode, act. The culture sits behind a
  small send / receive interface (`Culture`).
* `link` - `CultureLink`, the env runner's culture: a device reached through its
  bridge, the one place feedback and events leave from.
* `settings` - `DeviceSettings` and `CultureSettings`: which device, how it is reached.
* `shuffled_answers` - the pool `ablation: shuffled` draws the decoder's input from.
* `connector` - `CultureExchange`, the RLlib glue that calls `tick` in the
  module-to-env pipeline and writes the batch columns (`spikeloop.models.columns`).
* `feedback` - the feedback policy: rewards, events and surprise into commands.
* `meter` - the live information meter: bits per tick the culture's counts carry about the
  stimulation, the observation and the action, over a rolling window of ticks.
* `callbacks` - RLlib callbacks: open the link, feedback at episode end, metrics.
* `episode_numbers` - the trial's episode count across env runners and resumes.
* `ppo` - `closed_loop_config`, where env, module, learner, connector and
  callbacks meet; `finish` tells devices that training is over.
"""
