"""flotilla.agent"""
