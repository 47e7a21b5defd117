"""The round loop: federation discovery, screening of replies, learning rounds."""
