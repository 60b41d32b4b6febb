"""``python -m tts_launcher``: the launcher's command line (tts_launcher.server)."""

from tts_launcher.server import main

main()
