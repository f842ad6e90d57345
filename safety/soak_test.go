package safety

import "flag"

// flagRounds overrides the profile's rounds per fault: the soak of issue
// 19 (at least 1,000 fault rounds per single-server backend) is
// -safety.soak -safety.rounds=91 (docs/safety-soak.md).
var flagRounds = flag.Int("safety.rounds", 0, "rounds of each fault per cell (0: the profile's); -safety.soak -safety.rounds=91 is the 1,000-round soak of docs/safety-soak.md")
