"""Stand-in for verl's fully-async trainer (train/rollout split): the same report as main_ppo's."""

from verl.trainer.main_ppo import main

if __name__ == "__main__":
    main()
