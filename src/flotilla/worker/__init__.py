"""flotilla.worker"""
